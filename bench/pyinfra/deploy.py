"""The benchmark's node_exporter role for pyinfra: the same ten steps as bench/gpumon."""

from pyinfra import host
from pyinfra.operations import apt, files, systemd

TEXTFILE_DIR = "/var/lib/bench-node-exporter/textfile"
TEXTFILES = ["hardware", "software", "gpus", "rack", "schedule"]
MIRROR = host.data.apt_mirror_url

source = apt.repo(
    name="node_exporter apt source",
    src=f"deb [signed-by=/etc/apt/keyrings/bench-node-exporter.gpg] {MIRROR}/ ./",
    filename="bench-node-exporter",
)
apt.update(name="apt update after a source change", _if=source.did_change)
apt.packages(name="node_exporter package", packages=["prometheus-node-exporter"])
files.directory(
    name="textfile collector directory",
    path=TEXTFILE_DIR,
    user="root",
    group="root",
    mode="755",
)
flags = files.template(
    name="node_exporter flags",
    src="templates/prometheus-node-exporter.default.j2",
    dest="/etc/default/prometheus-node-exporter",
    user="root",
    group="root",
    mode="644",
    bench_listen_address=":9100",
    bench_textfile_dir=TEXTFILE_DIR,
)
for item in TEXTFILES:
    files.template(
        name=f"textfile collector file ({item})",
        src="templates/textfile.prom.j2",
        dest=f"{TEXTFILE_DIR}/{item}.prom",
        user="root",
        group="root",
        mode="644",
        inventory_hostname=host.name,
        item=item,
    )
systemd.service(
    name="node_exporter service",
    service="prometheus-node-exporter.service",
    running=True,
    enabled=True,
)
systemd.service(
    name="restart node_exporter",
    service="prometheus-node-exporter.service",
    restarted=True,
    _if=flags.did_change,
)
