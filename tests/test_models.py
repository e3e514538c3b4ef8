"""Models: registry, shapes, input normalisation, checkpoint round trips and broken files."""

from __future__ import annotations

import pytest
import torch

from debias.core.io import CorruptFileError, save_torch
from debias.models import ENCODERS, build_model, load_network, save_network
from debias.params import ModelParams


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
    assert set(ENCODERS) == {"lenet5", "simpleconv", "resnet18", "resnet50", "mlp"}
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

    # a whole LeNet-5 training step, against LeNet-5 as the papers build it: conv -> ReLU -> nn.MaxPool2d (ours pools
    # before the ReLU); the same values and gradients, bit for bit
    model = build_model("lenet5", 5, 28)
    reference = build_model("lenet5", 5, 28)
    features = reference.encoder.features
    assert isinstance(features[1], MaxPool2x2) and isinstance(features[2], nn.ReLU)
    assert isinstance(features[4], MaxPool2x2) and isinstance(features[5], nn.ReLU)
    reference.encoder.features = nn.Sequential(features[0], nn.ReLU(), nn.MaxPool2d(2), features[3], nn.ReLU(),
                                               nn.MaxPool2d(2), *features[6:])
    reference.load_state_dict(model.state_dict())
    images = torch.zeros(8, 3, 28, 28, dtype=torch.uint8)  # flat background, coloured strokes
    images[:, 0, 8:20, 10:14] = torch.randint(100, 256, (8, 12, 4), generator=generator, dtype=torch.uint8)
    logits = [net(images) for net in (model, reference)]
    assert torch.equal(logits[0], logits[1])
    for out in logits:
        torch.nn.functional.cross_entropy(out, torch.arange(8) % 5).backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad), name


# --------------------------------------------------------------------------- real-image backbones


@pytest.mark.parametrize(("name", "dim", "size"), [("resnet18", 512, 32), ("resnet50", 2048, 32)])
def test_resnets_from_scratch_build_and_run_offline(name: str, dim: int, size: int, monkeypatch) -> None:
    import torch.hub

    monkeypatch.setattr(torch.hub, "download_url_to_file", lambda *a, **k: pytest.fail("tried to download weights"))
    model = build_model(name, n_classes=2, input_shape=size).eval()
    assert not model.encoder.pretrained and model.encoder.net.conv1.kernel_size == (3, 3)  # CIFAR stem at 32 px
    with torch.no_grad():
        z, logits = model.embed_and_classify(torch.randint(0, 256, (2, 3, size, size), dtype=torch.uint8))
    assert z.shape == (2, dim) and logits.shape == (2, 2) and torch.isfinite(logits).all()


def test_default_normalisation_is_the_papers_and_bitwise_unchanged() -> None:
    model = build_model("lenet5", 5, 28)
    x = torch.randint(0, 256, (2, 3, 28, 28), dtype=torch.uint8)
    assert torch.equal(model.normalise(x), x.float().div(127.5).sub(1.0))
    assert "input_scale" not in model.state_dict()  # checkpoints keep weights only


def _fake_hub_weights(tmp_path, monkeypatch, name: str) -> dict:
    """A random state dict stored where torch.hub looks for the ImageNet weights file ($TORCH_HOME/hub/checkpoints)."""
    from debias.models import resnet_weights

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    folder = tmp_path / "torch" / "hub" / "checkpoints"
    folder.mkdir(parents=True)
    import torchvision.models

    state = getattr(torchvision.models, name)(weights=None).state_dict()
    torch.save(state, folder / resnet_weights(name).url.rsplit("/", 1)[-1])
    return state


@pytest.mark.slow
def test_pretrained_weights_come_from_the_hub_cache_with_imagenet_statistics(tmp_path, monkeypatch) -> None:
    import torch.hub

    from debias.models import weights_preprocessing

    state = _fake_hub_weights(tmp_path, monkeypatch, "resnet18")
    monkeypatch.setattr(torch.hub, "download_url_to_file", lambda *a, **k: pytest.fail("tried to download weights"))
    model = build_model(ModelParams(name="resnet18", pretrained=True), n_classes=3, input_shape=32).eval()
    assert torch.equal(model.encoder.net.conv1.weight, state["conv1.weight"])  # ImageNet stem, loaded weights
    prep = weights_preprocessing("resnet18")
    assert prep["mean"] == (0.485, 0.456, 0.406) and prep["crop_size"] == [224] and prep["resize_size"] == [256]
    x = torch.full((1, 3, 32, 32), 124, dtype=torch.uint8)
    expected = (124 / 255 - torch.tensor(prep["mean"])) / torch.tensor(prep["std"])
    assert torch.allclose(model.normalise(x)[0, :, 0, 0], expected, atol=1e-6)
    # a checkpoint of it reloads with the same stem and statistics, without fetching ImageNet weights again
    save_network(str(tmp_path / "m.pt"), model, "resnet18", 3, 32)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "elsewhere"))
    loaded, payload = load_network(str(tmp_path / "m.pt"))
    assert payload["options"]["pretrained"] is True and torch.equal(loaded.input_scale, model.input_scale)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_missing_pretrained_weights_name_the_cache_folder(tmp_path, monkeypatch) -> None:
    import torch.hub

    from debias.models import PretrainedWeightsError

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))

    def offline(*args, **kwargs):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)  # torch.hub's download step, as without network
    with pytest.raises(PretrainedWeightsError, match=r"resnet50 \(ResNet50_Weights.IMAGENET1K_V1\).*Network is unreachable.*"
                                                     r"put resnet50-0676ba61.pth into .*torch/hub/checkpoints/"):
        build_model(ModelParams(name="resnet50", pretrained=True), 2, 224)
    with pytest.raises(ValueError, match="pretrained = true needs ImageNet weights, which name = lenet5 does not have"):
        ModelParams(name="lenet5", pretrained=True)


def test_unit_head_input_reads_normalised_features_and_survives_a_checkpoint(tmp_path) -> None:
    """``head_input = unit`` (the released FairKL classifier, fc(normalize(feat))): the logits are head(z / |z|),
    so they do not change when z is scaled; the checkpoint keeps the setting; ``raw`` reads z itself."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = build_model("lenet5", 4, 28).eval()
    x = torch.randint(0, 255, (5, 3, 28, 28), dtype=torch.uint8)
    z, raw_logits = model.embed_and_classify(x)
    assert torch.allclose(raw_logits, model.head(z))
    model.head_input = "unit"
    z2, logits = model.embed_and_classify(x)
    assert torch.equal(z2, z)  # the encoder output itself is unchanged
    assert torch.allclose(logits, model.head(F.normalize(z, dim=1)))
    assert torch.allclose(model(x), logits)
    assert torch.allclose(model.head(model.head_features(3.0 * z)), logits, atol=1e-6)
    path = tmp_path / "m.pt"
    save_network(str(path), model, "lenet5", 4, 28)
    loaded, _ = load_network(str(path))
    assert loaded.head_input == "unit" and torch.allclose(loaded(x), logits)


def test_fit_head_on_unit_features_is_scale_invariant() -> None:
    """The per-epoch head fitted with ``stage2.head.features: unit`` sees z / |z|: scaling the encoder's last layer
    leaves the fitted head's predictions unchanged."""
    from debias.training.methods.head import fit_head
    from tests.test_training import tiny_split

    split = tiny_split(48)
    torch.manual_seed(0)
    model = build_model("lenet5", 3, 28)
    model.head_input = "unit"
    fit_head(model, split, 64, torch.device("cpu"), max_iter=20, warm_start=False)
    first = model(split.x).argmax(1)
    last = [m for m in model.encoder.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.mul_(7.0)
        last.bias.mul_(7.0)
    fit_head(model, split, 64, torch.device("cpu"), max_iter=20, warm_start=False)
    assert torch.equal(model(split.x).argmax(1), first)


# --------------------------------------------------------------------------- ResNet stems and input statistics


def _stem(net) -> tuple:
    """conv1, bn1 and maxpool of a torchvision ResNet as comparable tuples."""
    from torch import nn

    conv, bn, pool = net.conv1, net.bn1, net.maxpool
    pooling = (pool.kernel_size, pool.stride, pool.padding) if isinstance(pool, nn.MaxPool2d) else ()
    return ((type(conv).__name__, conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
             conv.bias is None), (type(bn).__name__, bn.num_features, bn.eps, bn.momentum),
            (type(pool).__name__, *pooling))


def _stem_output(net, size: int) -> tuple[int, ...]:
    with torch.no_grad():
        return tuple(net.maxpool(net.relu(net.bn1(net.conv1(torch.zeros(1, 3, size, size))))).shape)


@pytest.mark.parametrize("size", [32, 224])
def test_imagenet_stem_is_torchvisions_resnet18(size: int) -> None:
    import torchvision.models

    reference = torchvision.models.resnet18(weights=None)
    net = build_model(ModelParams(name="resnet18", stem="imagenet"), 10, size).encoder.net
    assert _stem(net) == _stem(reference)
    assert (net.conv1.kernel_size, net.conv1.stride, net.maxpool.kernel_size, net.maxpool.stride) == ((7, 7), (2, 2), 3, 2)
    shapes = {key: value.shape for key, value in reference.state_dict().items() if not key.startswith("fc.")}
    assert {key: value.shape for key, value in net.state_dict().items()} == shapes  # every layer, not just the stem
    assert _stem_output(net, size) == _stem_output(reference, size) == (1, 64, size // 4, size // 4)


def test_cifar_stem_is_a_3x3_stride_1_convolution_without_max_pool() -> None:
    import torchvision.models
    from torch import nn

    reference = torchvision.models.resnet18(weights=None)
    net = build_model(ModelParams(name="resnet18", stem="cifar"), 10, 224).encoder.net  # set, not picked by size
    conv = net.conv1
    assert (conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, conv.bias) == (
        3, 64, (3, 3), (1, 1), (1, 1), None)
    assert isinstance(net.maxpool, nn.Identity) and _stem_output(net, 32) == (1, 64, 32, 32)
    shapes = {key: value.shape for key, value in reference.state_dict().items() if not key.startswith("fc.")}
    assert {key: value.shape for key, value in net.state_dict().items()} == {**shapes,
                                                                             "conv1.weight": torch.Size([64, 3, 3, 3])}


@pytest.mark.slow
def test_auto_stem_is_cifar_up_to_64_px_from_scratch_and_left_out_of_the_options() -> None:
    from debias.models import ResNet18

    picked = {size: build_model(ModelParams(name="resnet18"), 2, size).encoder.stem for size in (32, 64, 65, 224)}
    assert picked == {32: "cifar", 64: "cifar", 65: "imagenet", 224: "imagenet"}
    assert ResNet18(32, pretrained=True, load_weights=False).stem == "imagenet"  # the weights' stem
    # auto and the auto statistics are not recorded: checkpoints of runs that set neither stay as they were
    assert build_model(ModelParams(name="resnet18"), 2, 32).encoder.options == {"pretrained": False}
    assert build_model(ModelParams(name="resnet18", stem="imagenet"), 2, 32).encoder.options == {
        "pretrained": False, "stem": "imagenet"}


def test_stem_errors_name_the_param() -> None:
    with pytest.raises(ValueError, match="stem = cifar sets the first layers of resnet18, resnet50; name = lenet5"):
        ModelParams(name="lenet5", stem="cifar")
    with pytest.raises(ValueError, match="stem = cifar replaces the first convolution that the ImageNet weights"):
        ModelParams(name="resnet50", pretrained=True, stem="cifar")
    with pytest.raises(ValueError, match="normalization"):
        ModelParams(normalization="mnist")


# FairKL's released main_infonce.py: Normalize(mean, std) per dataset (cifar10, corrupted-cifar10, bffhq share these)
RELEASED_STATISTICS = {"cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
                       "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
                       "half": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))}


@pytest.mark.parametrize("name", ["lenet5", "resnet18"])
@pytest.mark.parametrize("normalization", sorted(RELEASED_STATISTICS))
def test_normalization_is_the_released_codes_statistics(name: str, normalization: str, tmp_path) -> None:
    params = ModelParams(name=name, normalization=normalization, **({"stem": "imagenet"} if name == "resnet18" else {}))
    model = build_model(params, 3, 32).eval()
    x = torch.arange(256, dtype=torch.uint8).repeat(3 * 32 * 32 // 256 * 2)[: 2 * 3 * 32 * 32].view(2, 3, 32, 32)
    mean, std = (torch.tensor(v, dtype=torch.float64).view(1, 3, 1, 1) for v in RELEASED_STATISTICS[normalization])
    expected = (x.double() / 255 - mean) / std
    assert torch.allclose(model.normalise(x).double(), expected, atol=1e-5, rtol=0)  # float32 rounding only
    assert model.encoder.options["normalization"] == normalization
    # a checkpoint rebuilds the same statistics and stem
    save_network(str(tmp_path / "m.pt"), model, name, 3, 32)
    loaded, payload = load_network(str(tmp_path / "m.pt"))
    assert payload["options"] == model.encoder.options
    assert torch.equal(loaded.normalise(x), model.normalise(x))
    if name == "resnet18":
        assert loaded.encoder.stem == "imagenet"
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_normalization_leaves_feature_vectors_alone() -> None:
    model = build_model(ModelParams(name="mlp", normalization="cifar10"), 2, (5,))
    x = torch.randn(4, 5)
    assert torch.equal(model.normalise(x), x)


@pytest.mark.slow
def test_initial_weights_must_have_the_same_stem_and_statistics(tmp_path) -> None:
    from debias.core.errors import StaleInputError
    from debias.models import load_initial_weights

    params = ModelParams(name="resnet18", stem="imagenet", normalization="cifar10")
    save_network(str(tmp_path / "erm.pt"), build_model(params, 2, 32), "resnet18", 2, 32)
    assert set(load_initial_weights(str(tmp_path / "erm.pt"), params, 2, 32)) >= {"encoder.net.conv1.weight"}
    for other in (ModelParams(name="resnet18", normalization="cifar10"), ModelParams(name="resnet18", stem="imagenet")):
        with pytest.raises(StaleInputError, match="rerun train_erm"):
            load_initial_weights(str(tmp_path / "erm.pt"), other, 2, 32)
