"""The scale benchmark's file/template-only role for pyinfra: the same eight steps as
bench/gpumon/roles/bench_files."""

from pyinfra import host
from pyinfra.operations import files

ROOT = host.data.bench_root
TEXTFILES = ["hardware", "software", "gpus", "rack", "schedule"]

files.directory(
    name="config directory", path=f"{ROOT}/etc/bench", user="root", group="root", mode="755"
)
files.directory(
    name="textfile directory",
    path=f"{ROOT}/etc/bench/textfile",
    user="root",
    group="root",
    mode="755",
)
files.template(
    name="config file",
    src="templates/bench.conf.j2",
    dest=f"{ROOT}/etc/bench/bench.conf",
    user="root",
    group="root",
    mode="644",
    bench_listen_address=":9100",
    bench_root=ROOT,
)
for item in TEXTFILES:
    files.template(
        name=f"textfile collector file ({item})",
        src="templates/textfile.prom.j2",
        dest=f"{ROOT}/etc/bench/textfile/{item}.prom",
        user="root",
        group="root",
        mode="644",
        inventory_hostname=host.name,
        item=item,
    )
