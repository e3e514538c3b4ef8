"""Second round of silent and unclear cases (issue 23), done for real in stage subprocesses: a machine setting
spelt with a non-ASCII digit, a failed or interrupted stage's message by hand and under DVC, a section's own
error naming its keys once. The data cases live beside their sources (tests/test_image_sources.py,
tests/test_tabular.py) and compare's in tests/test_compare.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.conftest import assert_clean_failure, make_workspace, run_stage


@pytest.fixture(scope="module")
def broken_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace whose download fails at once: an image folder that does not exist."""
    return make_workspace(tmp_path_factory.mktemp("broken") / "ws",
                          {"data": {"source": "imagefolder", "imagefolder": {"root": "/nonexistent/folder"}}})


@pytest.mark.slow
@pytest.mark.parametrize("variable", ["DEBIAS_THREADS", "DEBIAS_NPROC"])
def test_a_setting_with_a_non_ascii_digit_is_named(tmp_path: Path, variable: str) -> None:
    """'²'.isdigit() is True in Python and int('²') fails: the message names the variable, no traceback."""
    import subprocess
    import sys

    from tests.faults.conftest import stage_env

    if variable == "DEBIAS_THREADS":
        workspace = make_workspace(tmp_path / "ws")
        done = run_stage(workspace, "download", DEBIAS_THREADS="²")
        assert_clean_failure(done, "DEBIAS_THREADS = '²'; allowed: a whole number >= 1", stage="download")
        assert "invalid literal" not in done.stderr
        return
    done = subprocess.run([sys.executable, "-c", "from debias.harness.launch import nproc_from_env; nproc_from_env()"],
                          env=stage_env(DEBIAS_NPROC="²"), capture_output=True, text=True, timeout=60)
    assert "ValueError: DEBIAS_NPROC = '²'; allowed: a whole number >= 1" in done.stderr, done.stderr


@pytest.mark.slow
def test_a_failed_stage_run_by_hand_keeps_its_outputs_and_says_so(broken_source: Path) -> None:
    done = run_stage(broken_source, "download")
    assert_clean_failure(done, "data.imagefolder.root = '/nonexistent/folder' is not a folder", stage="download")
    assert "DVC removed" not in done.stderr  # not run by DVC: nothing was removed


@pytest.mark.slow
def test_a_failed_stage_under_dvc_says_dvc_removed_the_outputs_and_how_to_restore(broken_source: Path) -> None:
    """DVC sets $DVC_STAGE for every stage command and removes the stage's outputs before running it (checked
    with dvc itself in test_silent_results_faults.py::test_dvc_checkout_brings_back_the_outputs_a_failed_stage_lost)."""
    done = run_stage(broken_source, "download", DVC_STAGE="download")
    assert_clean_failure(done, "is not a folder", "DVC removed this stage's previous outputs before running it",
                         "`dvc checkout download` restores the ones dvc.lock records", stage="download")
    assert "intact" not in done.stderr


@pytest.mark.slow
def test_a_section_check_names_its_keys_once(tmp_path: Path) -> None:
    workspace = make_workspace(tmp_path / "ws", {"data": {"tabular": {"val_fraction": 0.5, "test_fraction": 0.45}}})
    done = run_stage(workspace, "download")
    assert_clean_failure(done, "data.tabular.val_fraction + data.tabular.test_fraction = 0.95 leaves too little",
                         stage="download")
    assert "data.tabular.data.tabular" not in done.stderr


def test_commands_that_write_into_a_user_folder_leave_other_files_alone(tmp_path: Path, capsys) -> None:
    """plots-template over a user's file (or onto a folder) is refused, over a template it replaces; example-folder
    refuses a size it cannot draw (its non-empty-folder refusal: tests/test_image_sources.py)."""
    from debias.tools.cli import main as cli_main

    mine = tmp_path / "README.md"
    mine.write_text("my notes\n")
    assert cli_main(["plots-template", str(mine)]) == 2
    assert "is not a plots template (it lacks DVC's {plot_divs} placeholder); it is left as it is" in capsys.readouterr().err
    assert mine.read_text() == "my notes\n"
    assert cli_main(["plots-template", str(tmp_path)]) == 2 and "is a folder" in capsys.readouterr().err
    template = tmp_path / "template.html"
    assert cli_main(["plots-template", str(template)]) == 0
    assert cli_main(["plots-template", str(template)]) == 0  # its own file: replaced
    for size in ("0", "-3", "7"):
        assert cli_main(["example-folder", str(tmp_path / f"shapes{size}"), "--size", size]) == 2
        assert f"size = {size}; allowed: 8 pixels or more" in capsys.readouterr().err
        assert not (tmp_path / f"shapes{size}").exists()


def test_check_params_checks_the_files_of_other_sources_too(tmp_path: Path, capsys) -> None:
    """The neighbours of the image-folder checks: an npz that is not there, a data.path folder without the
    dataset's files; and equalized_odds against the npz's own labels (3 classes)."""
    import numpy as np
    import yaml

    from debias.tools.cli import main as cli_main
    from tests.conftest import committed_text

    def check(data: dict, probe: dict | None = None) -> tuple[int, str]:
        params = yaml.safe_load(committed_text("params.yaml"))
        params["data"].update(data)
        params["probe"].update(probe or {})
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
        code = cli_main(["check-params", str(tmp_path / "params.yaml")])
        return code, capsys.readouterr().err

    code, err = check({"source": "npz", "path": str(tmp_path / "absent.npz")})
    assert code == 2 and "absent.npz' does not exist" in err
    (tmp_path / "empty").mkdir()
    code, err = check({"source": "adult", "path": str(tmp_path / "empty")})
    assert code == 2 and "lacks adult.data; put the original files" in err
    np.savez(tmp_path / "three.npz", x=np.zeros((6, 8, 8), np.uint8), y=np.array([0, 1, 2, 0, 1, 2]),
             a=np.array([0, 1, 0, 1, 0, 1]))
    assert check({"source": "npz", "path": str(tmp_path / "three.npz")})[0] == 0
    code, err = check({"source": "npz", "path": str(tmp_path / "three.npz")}, {"postprocess": "equalized_odds"})
    assert code == 2 and "data.source = npz (bias.protocol = auto) has 3 classes" in err
