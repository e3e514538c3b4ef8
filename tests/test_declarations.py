"""A broken method module and an incomplete params.yaml are refused with one line, never run on hidden defaults.

- A declaration module that cannot be imported (import or syntax error) or declares itself wrongly (a name registered
  twice, a params section owned twice, a default without its source, no memory plan) ends every stage, download
  included, and check-params with one line naming the module and what is wrong, exit 2, no traceback.
- A params file that leaves out a registered variant's section (``stage2.cnc``) or a registry's ``method`` is
  refused naming it: the schema's defaults (anchor fraction 1.0 and accumulation 32 where the file's comment says
  0.1 and 1) would otherwise run unseen.
- The lists of methods people read (params.yaml's comments, docs/methods.md) are the registry's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from debias.core.declarations import import_declarations
from debias.core.errors import DeclarationError
from debias.params import ParamsError
from debias.schema import load_params
from debias.tools.cli import main as cli_main
from tests.conftest import REPO, committed_text
from tests.faults.conftest import launcher_command

# A module named in DEBIAS_METHODS, broken in each way a declaration can be.
BROKEN = {
    "syntax": ("from debias.training.methods.registry import register_method\nregister_method('x', 'a:b'\n",
               "SyntaxError: '(' was never closed"),
    "import": ("import no_such_package_for_a_method\n", "ModuleNotFoundError: No module named "
                                                         "'no_such_package_for_a_method'"),
    "twice": ("from debias.training.methods.registry import register_method\n"
              "register_method('cnc', 'a:b', memory_plan=None)\n", "stage-2 method 'cnc' is registered twice"),
    "section": ("from debias.training.methods.cnc import CNCParams, SOURCES\n"
                "from debias.training.methods.registry import register_method\n"
                "register_method('cnc2', 'a:b', section='cnc', params=CNCParams, sources=SOURCES, memory_plan=None)\n",
                "params section stage2.cnc is already cnc's"),
    "source": ("from debias.training.methods.cnc import CNCParams\n"
               "from debias.training.methods.registry import register_method\n"
               "register_method('cnc2', 'a:b', section='cnc2', params=CNCParams, sources={}, memory_plan=None)\n",
               "no source for stage2.cnc2."),
    "plan": ("from debias.training.methods.registry import register_method\nregister_method('plain', 'a:b')\n",
             "stage-2 method 'plain' declares no memory_plan"),
}
STAGES = ["source", "download", "inject_bias", "train_erm", "infer_groups", "train_contrastive", "linear_probe", "evaluate",
          "report"]


def _env(folder: Path, module: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "DVC_", "DEBIAS_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(folder), str(REPO / "src"), str(REPO)]), DEBIAS_TRACKING="off",
               DEBIAS_THREADS="1", DEBIAS_METHODS=module, DEBIAS_FORKSERVER_IDLE="60")
    return env


@pytest.fixture(scope="module")
def broken_modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder holding every broken module: the same PYTHONPATH for every stage run, so one warm fork server forks
    them all (``DEBIAS_METHODS``, which picks the module, is read by the stage, not at the server's imports)."""
    folder = tmp_path_factory.mktemp("broken-modules")
    for kind, (source, _) in BROKEN.items():
        (folder / f"broken_{kind}.py").write_text(source)
    return folder


def _run_broken(tmp_path: Path, modules: Path, kind: str, command: list[str]) -> subprocess.CompletedProcess:
    (tmp_path / "params.yaml").write_text(committed_text("params.yaml"))
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=_env(modules, f"broken_{kind}"),
                          timeout=300)


def _stage(stage: str) -> list[str]:
    """dvc.yaml's command of ``stage`` (the launcher: forked by the warm fork server once one is up)."""
    return launcher_command(str(REPO / "pipeline" / f"{stage}.py"))


def _assert_one_line(done: subprocess.CompletedProcess, kind: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    error = [line for line in done.stderr.splitlines() if f"'broken_{kind}' is broken" in line]
    assert len(error) == 1 and BROKEN[kind][1] in error[0], done.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_a_broken_method_module_ends_every_stage_with_one_line(tmp_path: Path, broken_modules: Path, stage: str) -> None:
    done = _run_broken(tmp_path, broken_modules, "syntax", _stage(stage))
    _assert_one_line(done, "syntax")
    assert not (tmp_path / "data").exists()  # refused before any work


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_each_way_a_declaration_breaks_is_named_by_download(tmp_path: Path, broken_modules: Path, kind: str) -> None:
    _assert_one_line(_run_broken(tmp_path, broken_modules, kind, _stage("download")), kind)


@pytest.mark.slow
def test_a_broken_method_module_is_named_by_check_params(tmp_path: Path, broken_modules: Path) -> None:
    check = [sys.executable, "-m", "debias.tools.cli", "check-params", "params.yaml"]
    _assert_one_line(_run_broken(tmp_path, broken_modules, "twice", check), "twice")


def test_a_broken_module_inside_a_package_is_named_with_its_line(tmp_path: Path, monkeypatch) -> None:
    """The registries' own packages are imported the same way: a syntax error names the module, file and line."""
    package = tmp_path / "labmethods"
    (package / "good").mkdir(parents=True)
    (package / "bad").mkdir()
    (package / "__init__.py").write_text("")
    (package / "good" / "__init__.py").write_text("LOADED = True\n")
    (package / "bad" / "__init__.py").write_text("x = 1\ndef broken(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(DeclarationError) as info:
        import_declarations("labmethods", packages=True)
    message = str(info.value)
    assert message.startswith("a declaration module 'labmethods.bad' is broken: SyntaxError: ")
    assert f"{package / 'bad' / '__init__.py'}, line 2" in message and "\n" not in message


def _without(*keys: str) -> dict:
    params = yaml.safe_load(committed_text("params.yaml"))
    for key in keys:
        top, name = key.split(".")
        del params[top][name]
    return params


@pytest.mark.parametrize("key", ["stage2.cnc", "groups.cluster", "probe.dfr", "stage2.method", "groups.method",
                                 "probe.method"])
def test_a_params_file_leaving_out_a_declared_section_or_a_method_is_refused(tmp_path: Path, key: str,
                                                                              capsys) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(_without(key), sort_keys=False))
    with pytest.raises(ParamsError, match=rf"^{re.escape(str(path))} has no {re.escape(key)}: the "):
        load_params(path)
    assert cli_main(["check-params", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"has no {key}: " in err and "valid (" not in err


def test_setting_a_key_the_file_leaves_out_says_so_instead_of_suggesting_itself(tmp_path: Path, capsys) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(_without("stage2.cnc"), sort_keys=False))
    assert cli_main(["check-params", str(path), "-S", "stage2.cnc.temperature=0.1"]) == 2
    err = capsys.readouterr().err
    assert "'stage2.cnc.temperature' is a parameter params.yaml does not state" in err
    assert "did you mean 'stage2.cnc.temperature'" not in err and "+stage2.cnc.temperature=VALUE" in err


def test_the_refusal_names_every_left_out_section(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(_without("stage2.cnc", "stage2.lff"), sort_keys=False))
    with pytest.raises(ParamsError, match=r"has no stage2\.cnc \(and 1 more: stage2\.lff\)"):
        load_params(path)


def test_the_shipped_params_state_every_declared_section(tmp_path: Path) -> None:
    """The committed params.yaml loads (no declared section left out) and its values, not the schema's defaults,
    are the ones used: a value the file states away from its default comes back as the file's."""
    path = tmp_path / "params.yaml"
    path.write_text(committed_text("params.yaml"))
    stated = yaml.safe_load(path.read_text())["stage2"]["cnc"]["num_positives"]
    default = type(load_params(path).stage2.cnc).model_fields["num_positives"].default
    assert stated != default, "pick another key: the shipped file states the default here"
    assert load_params(path).stage2.cnc.num_positives == stated


def _comment_names(text: str, key: str) -> set[str]:
    """The names listed as ``a | b (note) | c`` in the comment lines right above ``key:`` in params.yaml and after
    its value (the word before the first ``|``, then the first word after each)."""
    top, name = key.split(".")
    lines = text.split(f"\n{top}:\n", 1)[1].splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"  {name}:"))
    block = []
    for line in reversed(lines[:at]):
        if not line.strip().startswith("#"):
            break
        block.insert(0, line.strip().lstrip("#").strip())
    block.append(lines[at].partition("#")[2].strip())
    listing = re.sub(r"\([^)]*\)", " ", " ".join(block)).split("|")  # parentheses quote, they list nothing
    if len(listing) < 2:
        return set()
    return {re.findall(r"[a-z_0-9]+", part)[-1 if i == 0 else 0] for i, part in enumerate(listing)}


def test_params_yaml_lists_exactly_the_registered_methods() -> None:
    from debias.groups.registry import discover as group_methods
    from debias.training.methods import METHODS

    text = committed_text("params.yaml")
    assert _comment_names(text, "stage2.method") == set(METHODS), "params.yaml's comment above stage2.method"
    assert _comment_names(text, "groups.method") == set(group_methods()), "params.yaml's comment on groups.method"


def test_docs_methods_md_describes_every_registered_method_and_family() -> None:
    from debias.training.methods import METHODS

    text = (REPO / "docs" / "methods.md").read_text(encoding="utf-8")
    described = set()
    for line in text.splitlines():
        if line.startswith("- `"):
            head = re.sub(r"\([^)]*\)", "", line[2:].split(" — ")[0])  # the names, not what the parentheses quote
            described |= set(re.findall(r"`([a-z_0-9]+)`", head))
    assert set(METHODS) <= described, f"docs/methods.md has no '- `name` — ...' paragraph for " \
                                      f"{sorted(set(METHODS) - described)}"
    families = re.search(r"One package per method family under\s+`src/debias/training/methods/` \(([^)]*)\)", text)
    packages = {p.parent.name for p in (REPO / "src" / "debias" / "training" / "methods").glob("*/__init__.py")}
    assert families is not None and set(re.findall(r"`(\w+)`", families[1])) == packages
