"""Models: registry, shapes, input normalisation, checkpoint round trips and broken files."""

from __future__ import annotations

import pytest
import torch

from debias.io import CorruptFileError, save_torch
from debias.models import ENCODERS, build_model, load_network, save_network


@pytest.mark.parametrize(("name", "dim", "size"), [("lenet5", 84, 28), ("lenet5", 84, 32), ("simpleconv", 128, 16),
                                                   ("resnet18", 512, 16)])
def test_shapes(name: str, dim: int, size: int) -> None:
    model = build_model(name, n_classes=7, input_shape=size).eval()
    x = torch.randint(0, 256, (3, 3, size, size), dtype=torch.uint8)
    z, logits = model.embed_and_classify(x)
    assert z.shape == (3, dim) and logits.shape == (3, 7)
    assert torch.allclose(model(x), logits)


def test_uint8_and_float_inputs_agree() -> None:
    model = build_model("lenet5", 5, 28).eval()
    x = torch.randint(0, 256, (2, 3, 28, 28), dtype=torch.uint8)
    assert torch.allclose(model(x), model(x.float()))


def test_registry_and_errors() -> None:
    assert set(ENCODERS) == {"lenet5", "simpleconv", "resnet18", "mlp"}
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


def test_lenet_max_pool_matches_nn_max_pool_values_and_gradients() -> None:
    """MaxPool2x2 is nn.MaxPool2d(2): same outputs, and gradients routed to the same element on ties."""
    from torch import nn

    from debias.models import MaxPool2x2

    generator = torch.Generator().manual_seed(0)
    for shape in [(4, 6, 24, 24), (3, 2, 9, 7), (2, 16, 8, 8)]:
        x = torch.randn(shape, generator=generator)
        x = torch.where(torch.rand(shape, generator=generator) < 0.5, torch.full(shape, 0.25), x).relu()  # ties
        x[0, 0, 0, 0] = -float("inf")
        x.requires_grad_()
        grad = torch.randn(nn.MaxPool2d(2)(x).shape, generator=generator)
        expected = nn.MaxPool2d(2)(x)
        (expected_grad,) = torch.autograd.grad(expected, x, grad)
        ours = MaxPool2x2()(x)
        (ours_grad,) = torch.autograd.grad(ours, x, grad)
        assert torch.equal(ours, expected) and torch.equal(ours_grad, expected_grad)
        with torch.no_grad():
            assert torch.equal(MaxPool2x2()(x), expected)

    # a whole LeNet-5 training step, against the same network built with nn.MaxPool2d
    model = build_model("lenet5", 5, 28)
    reference = build_model("lenet5", 5, 28)
    reference.encoder.features[2], reference.encoder.features[5] = nn.MaxPool2d(2), nn.MaxPool2d(2)
    reference.load_state_dict(model.state_dict())
    images = torch.zeros(8, 3, 28, 28, dtype=torch.uint8)  # flat background, coloured strokes
    images[:, 0, 8:20, 10:14] = torch.randint(100, 256, (8, 12, 4), generator=generator, dtype=torch.uint8)
    for net in (model, reference):
        torch.nn.functional.cross_entropy(net(images), torch.arange(8) % 5).backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad), name
