# Sourced by scripts/setup and scripts/setup-bench: the interpreter every virtualenv is made with.
# $PYTHON when given; else Debian's own python3 when it is 3.11 or newer: Debian builds it with
# profile-guided optimisation and LTO, and a source build without them (pyenv's default, the
# python3 first on this machine's PATH) spends about a quarter more CPU on the same work
# (bench/README.md, "The interpreter"); else python3 from PATH.
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  PY=/usr/bin/python3
else
  PY=python3
fi

# venv_for DIR: make the virtualenv DIR with $PY, or make it again when it was made with another
# interpreter (a virtualenv is build output: its packages are installed into it again).
venv_for() {
  local dir=$1 want have
  want=$("$PY" -c 'import sys; print(sys.base_prefix)')
  have=$("$dir/bin/python" -c 'import sys; print(sys.base_prefix)' 2>/dev/null || true)
  if [ "$have" != "$want" ]; then
    rm -rf "$dir"
    mkdir -p "$(dirname "$dir")"
    "$PY" -m venv "$dir"
  fi
}
