"""stage2.speed's opt-in settings: bf16 autocast runs the encoder in bfloat16 while the losses and the head compute in
float32; channels-last weights give the same features. (``compile`` is not run here: it compiles for minutes on a
small CPU; benchmarks/speed_settings.py measures it.)"""

from __future__ import annotations

import math

import pytest
import torch

from debias import losses
from debias.core.runtime import seed_everything
from debias.params import ParamsError
from debias.schema import validate
from debias.training.methods import METHODS, Stage2Inputs, setup_method
from tests.test_training import tiny_split


def stage2(method: str, **speed) -> object:
    train = tiny_split(96)
    params = validate({"stage2": {"method": method, "optimizer": "adam", "lr": 1e-3, "batch_size": 32,
                                  "speed": speed,
                                  "cnc": {"num_positives": 4, "num_negatives": 4, "accumulation": 2,
                                          "anchor_fraction": 0.25},
                                  "wcl": {"projection_dim": 16}},
                       "loss": {"fairkl": {"weight": 0.5}}})
    inferred = train.a.clone()
    return setup_method(Stage2Inputs({"train": train}, inferred, inferred != train.y, None, params,
                                     torch.device("cpu"), seed_everything(0), inferred_group=train.y * 3 + inferred))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_bf16_autocast_trains_every_method_with_float32_losses(method: str) -> None:
    setup = stage2(method, autocast="bf16")
    seen: list[torch.dtype] = []
    first_layer = next(m for m in setup.model.encoder.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)))
    first_layer.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    metrics = setup.task.train_epoch(0)
    assert seen and set(seen) == {torch.bfloat16}  # the encoder ran in bfloat16
    assert setup.model.embed(tiny_split(4).x).dtype == torch.float32  # its features reach the losses in float32
    assert all(math.isfinite(v) for v in metrics.values())


def test_the_losses_compute_bf16_features_in_float32() -> None:
    """bf16 features give float32 losses equal to the losses of the same values in float32."""
    g = torch.Generator().manual_seed(0)
    z = torch.nn.functional.normalize(torch.randn(24, 8, generator=g), dim=1).to(torch.bfloat16)
    y, b = torch.randint(0, 3, (24,), generator=g), torch.randint(0, 2, (24,), generator=g)
    for name, fn in {"supcon": lambda t: losses.supcon(t, y),
                     "eps_supinfonce": lambda t: losses.eps_supinfonce(t, y, 0.25),
                     "eps_supcon": lambda t: losses.eps_supcon(t, y, 0.25), "fairkl": lambda t: losses.fairkl(t, y, b),
                     "cnc": lambda t: losses.cnc_two_sided(t[:8].reshape(2, 4, 8), t[8:16].reshape(2, 4, 8),
                                                           t[16:20].reshape(2, 2, 8), t[20:].reshape(2, 2, 8))}.items():
        low, full = fn(z), fn(z.float())
        assert low.dtype == torch.float32, name
        assert torch.equal(low, full), name


def test_channels_last_weights_give_the_same_features() -> None:
    plain, fast = stage2("eps_supinfonce"), stage2("eps_supinfonce", channels_last=True)
    conv = next(m for m in fast.model.encoder.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    x = tiny_split(16).x
    assert torch.allclose(plain.model.embed(x), fast.model.embed(x), rtol=1e-4, atol=1e-5)


def test_an_unknown_autocast_is_refused_naming_the_choices() -> None:
    with pytest.raises(ParamsError, match="autocast"):
        validate({"stage2": {"speed": {"autocast": "fp16"}}})
