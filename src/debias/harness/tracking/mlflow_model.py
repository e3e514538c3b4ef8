"""The code of the MLflow logged models (an MLflow "model from code", logged by ``StageRun.log_model``).

MLflow runs this file when the model is loaded (``mlflow.pyfunc.load_model("models:/<id>")``): the network
is rebuilt from the stage's checkpoint, logged beside it as the artifact ``checkpoint``, with
``debias.models.load_network`` (``torch.load(weights_only=True)``: no pickle). ``predict`` takes what the
pipeline stores (uint8 images ``[N,3,H,W]`` or float32 feature vectors ``[N,F]``) and returns the logits
``[N, classes]``; ``unwrap_python_model().network`` is the torch module. Needs the ``debias`` package.
Not imported by the pipeline (so it is not a code dependency of any stage).
"""

import mlflow
import numpy as np
from mlflow.pyfunc import PythonModel


class DebiasNetwork(PythonModel):
    """A debias encoder + linear head, rebuilt from its checkpoint."""

    def load_context(self, context) -> None:
        from debias.models import load_network

        self.network, self.checkpoint = load_network(context.artifacts["checkpoint"])
        self.network.eval()

    def predict(self, context, model_input: np.ndarray, params=None) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.network(torch.as_tensor(np.asarray(model_input))).float().numpy()


mlflow.models.set_model(DebiasNetwork())
