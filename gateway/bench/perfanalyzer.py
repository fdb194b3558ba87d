"""NVIDIA's perf_analyzer, for tests and `make bench` only: the real binary from its PyPI
wheel, run through Debian trixie's C library in a private sysroot.

The real wheels (perf-analyzer 2.58-2.60) are built for glibc 2.38; Debian 12 has 2.36, so
pip offers only a placeholder. This downloads the manylinux_2_38 wheel explicitly, and
trixie's libc6, libstdc++6 and libgcc-s1 with a private apt state (never touching the
system's), unpacks them with ``dpkg -x`` into a private directory and runs the binary
through that directory's loader. Everything lands in ``CACHE`` (gitignored), once.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: .cache/ sits beside gateway/
CACHE = ROOT / ".cache" / "perf-analyzer"
VERSION = "2.60.0"
PACKAGES = ("libc6", "libstdc++6", "libgcc-s1")
TRIXIE = """Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


def _run(command: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def _binary() -> Path:
    wheels = CACHE / "wheel"
    found = wheels / "perf_analyzer" / "bin" / "perf_analyzer"
    if found.exists():
        return found
    download = CACHE / "download"
    download.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
          "--platform", "manylinux_2_38_x86_64", "--python-version", "3.11", "-d", str(download),
          f"perf-analyzer=={VERSION}"])  # fmt: skip
    (wheel,) = download.glob("perf_analyzer-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(wheels)
    found.chmod(0o755)
    return found


def _sysroot() -> Path:
    root = CACHE / "sysroot"
    loader = root / "usr" / "lib" / "x86_64-linux-gnu" / "ld-linux-x86-64.so.2"
    if loader.exists():
        return root
    state = CACHE / "apt"
    parts = state / "sources.list.d"
    for folder in (
        parts,
        state / "lists" / "partial",
        state / "cache" / "archives" / "partial",
        state / "debs",
    ):
        folder.mkdir(parents=True, exist_ok=True)
    (parts / "trixie.sources").write_text(TRIXIE)
    options = [
        "-o", "Dir::Etc::SourceList=/dev/null", "-o", f"Dir::Etc::SourceParts={parts}",
        "-o", f"Dir::State::Lists={state / 'lists'}", "-o", f"Dir::Cache={state / 'cache'}",
        "-o", "Dir::State::status=/dev/null", "-o", "APT::Sandbox::User=root",
    ]  # fmt: skip
    _run(["apt-get", *options, "update"])
    _run(["apt-get", *options, "download", *PACKAGES], cwd=state / "debs")
    root.mkdir(parents=True, exist_ok=True)
    for deb in (state / "debs").glob("*.deb"):
        _run(["dpkg", "-x", str(deb), str(root)])
    if not loader.exists():
        raise RuntimeError(f"no loader at {loader} after unpacking {PACKAGES}")
    return root


def command() -> list[str]:
    """The command line prefix that runs perf_analyzer (installing it on first use)."""
    binary, root = _binary(), _sysroot()
    libraries = root / "usr" / "lib" / "x86_64-linux-gnu"
    bundled = binary.parent.parent / "lib"
    paths = [str(libraries), "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"]
    if bundled.is_dir():
        paths.insert(0, str(bundled))
    return [str(libraries / "ld-linux-x86-64.so.2"), "--library-path", ":".join(paths), str(binary)]


def bytes_input(data: bytes) -> dict[str, str]:
    """A BYTES element as perf_analyzer's --input-data takes it in base64: the serialized
    tensor, a 4-byte little-endian length before the bytes."""
    import base64

    return {"b64": base64.b64encode(len(data).to_bytes(4, "little") + data).decode()}


def input_data(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text(json.dumps({"data": rows}))
    return path


if __name__ == "__main__":  # `python -m gateway.bench.perfanalyzer`: install, then show the usage
    prefix = command()
    print(" ".join(prefix))
    shutil.which("true")
