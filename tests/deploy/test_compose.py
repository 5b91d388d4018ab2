"""The compose demo (deploy/docker/) without Docker: what each container is given, which network it is on, the
pip configuration carried into the image builds, run_demo.sh's prerequisites, and the README's sample output
against the recorded run it was rendered from. The demo itself (with its reachability checks) runs in .ci/run's
stage 3 wherever Docker can be had."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deploy.pflower_deploy import demo_page, pipconf

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"

COMPOSE = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
SERVICES: dict[str, dict] = COMPOSE["services"]
SUPERNODES = sorted(
    name for name, s in SERVICES.items() if s.get("entrypoint") == ["flower-supernode"] and "profiles" not in s
)


def expand(text: str) -> str:
    """A compose value with each ``${VAR:-default}`` at its default (what run_demo.sh sets is the same folder)."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)


def mounts(service: str) -> list[tuple[Path, str]]:
    """(host path, container path) of each bind mount of the service."""
    out = []
    for volume in SERVICES[service].get("volumes", []):
        source, target = expand(volume).split(":")[:2]
        out.append(((DOCKER / source).resolve(), target))
    return out


def credential_mounts(service: str) -> set[str]:
    return {target for _, target in mounts(service) if target.startswith(("/certs", "/keys"))}


def test_there_are_three_supernodes_and_a_check_service():
    assert SUPERNODES == ["supernode-0", "supernode-1", "supernode-2"]
    assert SERVICES["unregistered"]["profiles"] == ["checks"]  # not started by a plain `up`


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_no_container_gets_the_ca_key_or_a_whole_credentials_folder(service):
    """The CA's key signs certificates every SuperNode trusts: it stays on the host. Single files only: a
    folder mounted whole (certs/, keys/, or one above them) would bring it, or another node's key, along."""
    for source, target in mounts(service):
        assert source.name != "ca.key" and Path(target).name != "ca.key", (service, source, target)
        for folder in (DOCKER / "certs", DOCKER / "keys"):
            assert not folder.resolve().is_relative_to(source), f"{service} mounts {source}: it is or holds {folder}"


def proxy_config_files(tmp_path: Path, kind: str, *options: str) -> set[str]:
    """The certificate paths in the nginx configuration run_demo.sh renders for a proxy container."""
    out = tmp_path / kind
    done = subprocess.run(
        [sys.executable, "-m", "deploy.make_proxy_conf", "--superlink", "superlink:9091",
         "--superlink-name", "superlink", "--certs", "/certs", "--no-file-check", "--standalone", str(out),
         "--site-path", "/etc/pflower-proxy/pflower.conf", "--logs", "stdio", *options],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    assert not done.stdout
    return set(re.findall(r"/certs/[\w.]+", (out / "pflower.conf").read_text() + (out / "nginx.conf").read_text()))


def command_files(service: str) -> set[str]:
    command = SERVICES[service].get("command", [])
    return set(re.findall(r"/(?:certs|keys)/[\w.]+", " ".join(command)))


def test_each_container_gets_exactly_the_key_material_it_uses(tmp_path):
    """Least material, and enough of it: each service's /certs and /keys mounts are the files its command (or
    its nginx configuration, or register_nodes.sh) names, no more."""
    used = {
        "fleet-proxy": proxy_config_files(tmp_path, "fleet", "--fleet", "0.0.0.0:9092"),
        "control-proxy": proxy_config_files(tmp_path, "control", "--control", "0.0.0.0:9093", "--operator", "all"),
        "register": set(re.findall(r"/certs/[\w.]+", (DOCKER / "register_nodes.sh").read_text()))
        | {f"/keys/node{i}.pub" for i in range(3)},  # the script registers /keys/*.pub
    }
    assert used["fleet-proxy"] == {"/certs/server.pem", "/certs/server.key", "/certs/ca.crt"}
    for service in SERVICES:
        assert credential_mounts(service) == used.get(service, command_files(service)), service
    assert "/keys/*.pub" in (DOCKER / "register_nodes.sh").read_text()


@pytest.mark.parametrize("i", range(3))
def test_a_supernode_holds_its_own_private_key_and_no_other(i):
    service = f"supernode-{i}"
    keys = [(source, target) for source, target in mounts(service) if target.startswith("/keys")]
    assert keys == [((DOCKER / "keys" / f"node{i}").resolve(), "/keys/node")]
    assert f"partition-id={i} " in " ".join(SERVICES[service]["command"])
    for other in SERVICES:
        if other != service:
            assert all(source.name != f"node{i}" for source, _ in mounts(other)), (other, i)


def test_the_unregistered_check_uses_a_key_the_operator_never_registers():
    [(key, _)] = [m for m in mounts("unregistered") if m[1] == "/keys/node"]
    registered = {source.name for source, target in mounts("register") if target.startswith("/keys")}
    assert registered == {"node0.pub", "node1.pub", "node2.pub"}
    assert f"{key.name}.pub" not in registered


def network_members(network: str) -> set[str]:
    return {name for name, s in SERVICES.items() if network in s.get("networks", [])}


def closed(network: str) -> bool:
    """No way out (internal) and no address of the Docker host on it (the bridge gets no IPv4 address)."""
    options = COMPOSE["networks"][network]
    return (
        options.get("internal") is True
        and options.get("driver_opts", {}).get("com.docker.network.bridge.inhibit_ipv4") == "true"
    )


@pytest.mark.parametrize("service", [*SUPERNODES, "unregistered"])
def test_a_supernode_shares_its_network_with_the_fleet_proxy_only(service):
    [network] = SERVICES[service]["networks"]
    assert network_members(network) == {service, "fleet-proxy"}
    assert closed(network)


def test_the_superlinks_network_is_closed_and_holds_no_data_holder():
    assert network_members("link") == {"superlink", "superexec", "fleet-proxy", "control-proxy"}
    assert closed("link")
    assert SERVICES["superlink"]["networks"] == ["link"] and "ports" not in SERVICES["superlink"]
    assert SERVICES["control-proxy"]["ports"] == ["127.0.0.1:${PFLOWER_PORT:-19093}:9093"]


# --- the machine's pip configuration in the image builds ---

LISTING = """\
:env:.find-links='/srv/wheels'
:env:.timeout='60'
global.extra-index-url='file:///srv/pypi/simple https://user:secret@pypi.example.org/simple https://mirror.example.org/simple'
global.find-links='/elsewhere'
global.constraint='/etc/pip/constraints.txt'
global.index-url='https://proxy.example.org/pypi/simple'
install.find-links='/also-elsewhere'
install.trusted-host='mirror.example.org'
"""


def test_the_listing_is_read_with_the_environment_over_the_files():
    config = pipconf.parse(LISTING)
    assert config["global"]["find-links"] == "/srv/wheels"  # PIP_FIND_LINKS wins over both files' values
    assert "find-links" not in config["install"]
    assert config["install"] == {"trusted-host": "mirror.example.org"}
    assert pipconf.local_paths(config) == [Path("/srv/pypi"), Path("/srv/wheels"), Path("/etc/pip/constraints.txt")]
    with pytest.raises(ValueError, match=r"expected section\.key='value'"):
        pipconf.parse("global.index-url 'x'")


def test_the_written_pip_conf_means_to_pip_what_the_listing_says(tmp_path):
    """Round trip through pip itself: the file build_local_base.sh writes into the tree's /etc, read by pip as a
    global configuration file (here through XDG_CONFIG_DIRS), lists the same options."""
    config = pipconf.parse(LISTING)
    (tmp_path / "pip").mkdir()
    (tmp_path / "pip" / "pip.conf").write_text(pipconf.render(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(XDG_CONFIG_DIRS=str(tmp_path), HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "home"))
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, env=env, check=True
    ).stdout
    seen = pipconf.parse(listed)
    for section, options in config.items():
        for key, value in options.items():
            assert seen[section][key] == value, (section, key)


def test_only_remote_indexes_without_a_password_become_build_arguments():
    args, left_out = pipconf.build_args(pipconf.parse(LISTING))
    assert args == {
        "PFLOWER_PIP_INDEX_URL": "https://proxy.example.org/pypi/simple",
        "PFLOWER_PIP_EXTRA_INDEX_URL": "https://mirror.example.org/simple",
        "PFLOWER_PIP_TRUSTED_HOST": "mirror.example.org",
    }
    said = "\n".join(left_out)
    assert "file:///srv/pypi/simple (a local path" in said
    assert "https://***@pypi.example.org/simple (a password" in said and "secret" not in said
    assert "find-links /srv/wheels (local files" in said


def test_the_build_arguments_reach_the_dockerfile():
    """What pipconf makes is what the compose file passes to each app image build and the Dockerfile declares."""
    declared = set(re.findall(r"^ARG (PFLOWER_PIP_\w+)=", (DOCKER / "Dockerfile").read_text(), re.MULTILINE))
    assert declared == set(pipconf.BUILD_ARGS.values())
    for name, service in SERVICES.items():
        build = service.get("build")
        if build and build["dockerfile"] == "deploy/docker/Dockerfile":
            passed = {k for k in build["args"] if k.startswith("PFLOWER_PIP_")}
            assert passed == declared, name


def test_the_chroot_command_writes_the_file_and_names_the_paths(tmp_path):
    (tmp_path / "listing").write_text(LISTING)
    done = subprocess.run(
        [sys.executable, "-m", "deploy.pflower_deploy.pipconf", "--listing", str(tmp_path / "listing"), "chroot",
         str(tmp_path / "pip.conf")],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    assert done.stdout.split() == ["/srv/pypi", "/srv/wheels", "/etc/pip/constraints.txt"]
    assert "https://***@pypi.example.org" in done.stderr and "secret" not in done.stderr
    assert (tmp_path / "pip.conf").read_text().startswith("[global]\n")


# --- run_demo.sh's prerequisites ---


def test_run_demo_names_every_missing_prerequisite_before_doing_anything(tmp_path):
    """A machine with python3 but none of the others: one line names each missing command, exit 2, nothing made."""
    for tool in ("dirname", "sed", "python3"):
        (tmp_path / tool).symlink_to(shutil.which(tool))
    done = subprocess.run(
        ["/bin/bash", str(DOCKER / "run_demo.sh")],
        capture_output=True,
        text=True,
        env={"PATH": str(tmp_path)},
        check=False,
    )
    assert done.returncode == 2 and done.stdout == ""
    said = done.stderr.strip()
    for tool in ("curl", "openssl", "ssh-keygen", "ip (", "docker (", "docker compose or docker-compose", "flwr"):
        assert tool in said
    assert "python3" not in said
    readme = (DOCKER / "README.md").read_text()
    shown = readme[readme.index("## Prerequisites") :].split("\n## ", 1)[0]
    assert said in shown  # the README shows what the script says
    for tool in ("curl", "openssl", "ssh-keygen", "ip", "docker", "docker-compose", "python3", "flwr"):
        assert f"`{tool}`" in shown


# --- the README's sample output ---


def test_the_readme_shows_what_the_recorded_run_printed():
    assert demo_page.check(None, None) == []


def test_the_recorded_run_passed_every_check_and_printed_its_summary_once():
    build, demo = demo_page.record()
    assert re.search(r"^built pflower-base:local in \d+ s", build, re.MULTILINE)
    lines = demo.splitlines()
    for claim in (
        "isolation: supernode-0 cannot reach supernode-1",
        "isolation: supernode-0 cannot reach a port on the host",
        "refused: an unregistered SuperNode: its log says 'Exit Code: 305'",
        "summary.json: 3 rounds, 3 clients",
        "== demo finished in ",
    ):
        assert sum(line.startswith(claim) for line in lines) == 1, claim
    summaries = [line for line in lines if re.search(r"pflower fedavg on digits/dirichlet: 3 rounds", line)]
    assert len(summaries) == 1 and summaries[0].startswith("pflower ")


def test_the_shape_check_tells_a_changed_line_from_changed_numbers(tmp_path):
    build, demo = demo_page.record()
    # every temporary folder a build makes has a new random name (mktemp), the proxy base's included
    renamed = re.sub(r"(/tmp/pflower-[a-z-]+\.)\w+", lambda m: m.group(1) + "Zq7xWa", build)
    assert renamed != build and "/tmp/pflower-proxy-base.Zq7xWa" in renamed
    (tmp_path / "build.log").write_text(renamed)
    renumbered = re.sub(r"\d", lambda m: str((int(m.group(0)) + 3) % 10), demo)
    warning = "\x1b[93mWARNING \x1b[0m:   a loaded machine's warning\n  with a line of its own\n"
    assert renumbered.count("\nSuccessfully started run ") == 1
    (tmp_path / "demo.log").write_text(
        renumbered.replace("\nSuccessfully started run ", f"\n{warning}Successfully started run ")
    )
    assert demo_page.check(tmp_path / "build.log", tmp_path / "demo.log") == []
    dropped = "\n".join(line for line in demo.splitlines() if not line.startswith("isolation: supernode-0 cannot"))
    (tmp_path / "demo.log").write_text(dropped)
    [problem] = demo_page.check(tmp_path / "build.log", tmp_path / "demo.log")
    assert "-isolation: supernode-N cannot reach supernode-N (its port N answers" in problem
    (tmp_path / "demo.log").write_text(demo.replace("3 rounds, 3 clients", "3 rounds, 3 nodes"))
    [problem] = demo_page.check(tmp_path / "build.log", tmp_path / "demo.log")
    assert "+summary.json: N rounds, N nodes" in problem


def test_a_hand_edited_sample_is_caught():
    page = (DOCKER / "README.md").read_text()
    block = demo_page.block_of(page)
    edited = page.replace(block, block.replace("refused: ", "refused:  ", 1))
    [problem] = demo_page.check(None, None, page=edited)
    assert "is not what deploy/docker/demo-run/ renders" in problem
