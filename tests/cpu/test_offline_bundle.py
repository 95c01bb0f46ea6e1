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
