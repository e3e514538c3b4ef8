"""Models: registry, shapes, input normalisation, checkpoint round trips and broken files."""

from __future__ import annotations

import pytest
import torch

from debias.io import CorruptFileError, save_torch
from debias.models import ENCODERS, build_model, load_network, save_network


@pytest.mark.parametrize(("name", "dim", "size"), [("lenet5", 84, 28), ("lenet5", 84, 32), ("simpleconv", 128, 16),
                                                   ("resnet18", 512, 16)])
def test_shapes(name: str, dim: int, size: int) -> None:
    model = build_model(name, n_classes=7, image_size=size).eval()
    x = torch.randint(0, 256, (3, 3, size, size), dtype=torch.uint8)
    z, logits = model.embed_and_classify(x)
    assert z.shape == (3, dim) and logits.shape == (3, 7)
    assert torch.allclose(model(x), logits)


def test_uint8_and_float_inputs_agree() -> None:
    model = build_model("lenet5", 5, 28).eval()
    x = torch.randint(0, 256, (2, 3, 28, 28), dtype=torch.uint8)
    assert torch.allclose(model(x), model(x.float()))


def test_registry_and_errors() -> None:
    assert set(ENCODERS) == {"lenet5", "simpleconv", "resnet18"}
    with pytest.raises(ValueError, match="model.name = 'vgg' is unknown"):
        build_model("vgg", 2, 28)
    with pytest.raises(ValueError, match="image_size >= 16"):
        build_model("lenet5", 2, 8)


def test_checkpoint_round_trip(tmp_path) -> None:
    model = build_model("lenet5", 5, 28)
    save_network(str(tmp_path / "m.pt"), model, "lenet5", 5, 28, method="erm")
    loaded, payload = load_network(str(tmp_path / "m.pt"))
    x = torch.randint(0, 256, (2, 3, 28, 28), dtype=torch.uint8)
    assert torch.equal(loaded(x), model.eval()(x))
    assert payload["meta"] == {"method": "erm"}


def test_truncated_and_foreign_checkpoints_are_clear_errors(tmp_path) -> None:
    model = build_model("lenet5", 5, 28)
    path = tmp_path / "m.pt"
    save_network(str(path), model, "lenet5", 5, 28)
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CorruptFileError, match="truncated or foreign"):
        load_network(str(path))
    torch.save({"weights": 1}, tmp_path / "foreign.pt")
    with pytest.raises(CorruptFileError, match="not a debias checkpoint file"):
        load_network(str(tmp_path / "foreign.pt"))
    save_torch(tmp_path / "wrong.pt", {"model_name": "lenet5", "n_classes": 3, "image_size": 28,
                                       "state_dict": model.state_dict()}, kind="checkpoint")
    with pytest.raises(CorruptFileError, match="weights do not fit lenet5"):
        load_network(str(tmp_path / "wrong.pt"))
