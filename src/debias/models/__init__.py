"""Models: an encoder (features z) then a linear head, built by name from a registry and checkpointed.

``network``      :class:`Network` and :class:`Encoder`, input shapes and normalisations;
``encoders``     the encoders (LeNet-5, SimpleConvNet, ResNet-18/50, MLP) and CPU max-pooling;
``registry``     ``model.name`` -> encoder (:data:`ENCODERS`), :func:`build_model`;
``checkpoints``  :func:`save_network`, :func:`load_network`, :func:`load_initial_weights`.
"""

from debias.models.checkpoints import load_initial_weights, load_network, network_input_shape, save_network
from debias.models.encoders import (DEFAULT_ACTIVATION, MLP, LeNet5, MaxPool2x2, PretrainedWeightsError, ResNet18,
                                    ResNet50, SimpleConvNet, resnet_weights, weights_preprocessing)
from debias.models.network import NORMALIZATIONS, Encoder, InputShape, Network, as_input_shape, input_modality
from debias.models.registry import ENCODERS, EncoderSpec, build_encoder, build_model, encoder_options, resolve_encoder

__all__ = ["DEFAULT_ACTIVATION", "ENCODERS", "MLP", "NORMALIZATIONS", "EncoderSpec", "Encoder", "InputShape", "LeNet5",
           "MaxPool2x2", "Network", "PretrainedWeightsError", "ResNet18", "ResNet50", "SimpleConvNet", "as_input_shape",
           "build_encoder", "build_model", "encoder_options", "input_modality", "load_initial_weights", "load_network",
           "network_input_shape", "resnet_weights", "save_network", "weights_preprocessing", "resolve_encoder"]
