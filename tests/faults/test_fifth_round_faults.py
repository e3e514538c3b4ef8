"""Fifth round of silent-wrong attacks: a workspace never shows an output under params it was not computed with."""

from __future__ import annotations

import copy

import pytest
import yaml

from tests.conftest import committed_text


@pytest.mark.slow
def test_params_changed_while_a_stage_ran_fail_it_and_remove_what_it_wrote(tmp_path, monkeypatch, capsys) -> None:
    """A second `dvc exp run -S` writes params.yaml while the first one's stage trains: the stage fails naming the
    change, and the outputs it computed with the values it read are gone (DVC would otherwise record the new values
    beside them: `dvc status` clean, the model another run's)."""
    from debias.harness.stage import main

    raw = yaml.safe_load(committed_text("params.yaml"))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "dvc.yaml").write_text(committed_text("dvc.yaml"))
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "models/stage2.pt"

    def body(params, run) -> None:
        model.parent.mkdir(parents=True, exist_ok=True)
        model.write_bytes(b"trained at the first run's lr")
        other = copy.deepcopy(raw)
        other["stage2"]["lr"] = 0.004  # the second experiment's -S
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(other))

    with pytest.raises(SystemExit) as stopped:
        main("train_contrastive", body)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"params.yaml changed while train_contrastive ran (stage2.lr {raw['stage2']['lr']!r} -> 0.004)" in err
    assert "models/stage2.pt" in err and not model.exists()
    assert not (tmp_path / "reports/runs/train_contrastive.json").exists()  # no run record of a run that failed
    # unchanged params: the same body's outputs stay
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    main("train_contrastive", lambda params, run: (model.parent.mkdir(parents=True, exist_ok=True),
                                                   model.write_bytes(b"ok")))
    assert model.read_bytes() == b"ok"
