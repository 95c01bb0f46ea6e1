"""The offline bundle's pins: exact, one version per package across all lists (two versions of one
package make `pip install --target` fail on the air-gapped host), and lm-eval's pin is the harness's."""

import re
import tomllib

from conftest import REPO

BUNDLE = REPO / "tools" / "offline_bundle"


def pins():
    out = []
    for f in sorted(BUNDLE.glob("requirements-*.txt")):
        for line in f.read_text().splitlines():
            line = line.split("#")[0].strip()
            if line:
                out.append((f.name, line))
    return out


def test_every_requirement_is_pinned_exactly_once():
    seen = {}
    for fname, line in pins():
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.\-+]+)", line)
        assert m, f"{fname}: {line!r} is not an exact pin"
        name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
        assert name not in seen, f"{name} pinned in {seen.get(name)} and {fname}"
        seen[name] = fname
    assert {"vllm", "lm-eval", "datasets", "evaluate"} <= set(seen)


def test_bundle_pins_match_the_project_pins():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["bench"]
    bundle = {re.sub(r"[-_.]+", "-", line.split("==")[0]).lower(): line.split("==")[1] for _, line in pins()}
    for req in declared:
        if "==" in req:
            name, version = req.split("==")
            assert bundle[re.sub(r"[-_.]+", "-", name).lower()] == version, req


def test_install_without_the_project_unpacks_the_bundle_and_builds_nothing(tmp_path):
    """`install.sh --no-project CHECKOUT` (the caller brings its own checkout and extension): the pieces are
    reassembled, checked and unpacked, vllm and lm_eval import from the bundle, the checkout's vLLM plugin
    entry point is registered next to them, and the check does not import this project (the shipped
    source's pyproject is broken here: building it would fail)."""
    import hashlib
    import io
    import lzma
    import shutil
    import subprocess
    import tarfile

    site = tmp_path / "build" / "site"
    for name, version in (("vllm", "0.24.0"), ("lm_eval", "0.4.13")):
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (site / "_vllm_megakernel_src").mkdir()
    (site / "_vllm_megakernel_src" / "pyproject.toml").write_text("this is not toml [\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(site, arcname="site")
    archive = lzma.compress(buf.getvalue())
    out = tmp_path / "bundle"
    (out / "p0").mkdir(parents=True)
    (out / "p0" / "bundle.part0").write_bytes(archive[: len(archive) // 2])
    (out / "p1").mkdir()
    (out / "p1" / "bundle.part1").write_bytes(archive[len(archive) // 2:])
    (out / "bundle.sha256").write_text(f"{hashlib.sha256(archive).hexdigest()}  site.tar.xz\n")
    for f in ("install.sh", "env.sh"):
        shutil.copy(BUNDLE / f, out / f)
    root = tmp_path / "host"
    root.mkdir()
    env = {**__import__("os").environ, "OFFLINE_BUNDLE_ROOT": str(root), "OFFLINE_BUNDLE_PARTS": str(root / "parts")}

    def install(*args):
        return subprocess.run(["bash", str(out / "install.sh"), *args], env=env, capture_output=True, text=True,
                              timeout=300)

    for piece in ("p0", "p1"):
        assert install("--stash", str(out / piece)).returncode == 0
    checkout = tmp_path / "checkout"  # what the caller runs: its entry points make vLLM load it as a plugin
    checkout.mkdir()
    shutil.copy(REPO / "pyproject.toml", checkout / "pyproject.toml")
    done = install("--no-project", str(checkout))
    assert done.returncode == 0, done.stderr
    assert "vllm 0.24.0 lm_eval 0.4.13" in done.stdout and "not built from the bundle" in done.stdout
    assert "'megakernel = vllm_megakernel:register'" in done.stdout  # found the way vLLM finds plugins
    assert (root / "site" / "vllm" / "__init__.py").exists() and not (root / "site.tar.xz").exists()
    assert install("--bogus").returncode == 2


def test_a_bundle_piece_and_the_source_tree_fit_one_device_transfer():
    """The device tool carries the working tree and the named paths in one transfer of at most 64 MiB: a piece
    must fit next to the tree with room for a session's results (session AA's first stash call was refused
    with 36 MiB pieces once the committed results made the tree 27 MiB)."""
    import subprocess

    piece_mib = int(re.search(r"^PIECE_MIB=(\d+)", (BUNDLE / "build.sh").read_text(), re.M).group(1))
    # what travels with every call: tracked files and untracked ones git does not ignore (a stash call carries
    # the piece, install.sh, env.sh and bundle.sha256 besides)
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout
    tree = sum((REPO / f).stat().st_size for f in files.decode().split("\0") if f and (REPO / f).is_file())
    small = sum((BUNDLE / f).stat().st_size for f in ("install.sh", "env.sh")) + 4096  # and bundle.sha256
    margin = 4 * 2**20  # what the next session's results and scripts add before the bundle is rebuilt
    assert tree + piece_mib * 2**20 + small + margin <= 64 * 2**20, (
        f"the tree is {tree / 2**20:.1f} MiB: lower PIECE_MIB in tools/offline_bundle/build.sh")
