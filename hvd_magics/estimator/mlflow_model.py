"""Log a fitted :class:`HorovodModel` to the MLflow run of its fit, with its MLflow flavour
(``mlflow.tensorflow`` for tf_keras, ``mlflow.pytorch``) and a signature inferred from a few
rows of the training DataFrame."""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from hvd_magics.protocol import TORCH

#: Rows of the training DataFrame used for the signature and input example.
EXAMPLE_ROWS = 5


def example_inputs(frame: Any, columns: list[str], names: list[str] | None) -> Any:
    """A few rows of ``columns`` as float32 arrays (a dict by input name for several)."""
    rows = frame.select(columns).limit(EXAMPLE_ROWS).collect()
    arrays = []
    for column in columns:
        values = [row[column] for row in rows]
        values = [v.toArray() if hasattr(v, "toArray") else v for v in values]
        arrays.append(np.asarray(values, dtype=np.float32).reshape(len(values), -1))
    return dict(zip(names, arrays)) if names else arrays[0]


def log_fitted_model(model: Any, example: Any) -> str | None:
    """Log ``model`` to the MLflow run of its fit (``model.run_record.mlflow_run_id``); return
    the model URI, or ``None`` when MLflow failed, which warns and never fails the fit."""
    record = model.run_record
    try:
        import mlflow
        from mlflow.models import infer_signature

        from hvd_magics.job.records.mlflow_run import url_not_printed
        from hvd_magics.task.predict import predictor

        network = model.get_model()
        arrays = list(example.values()) if isinstance(example, dict) else [example]
        signature = infer_signature(example, predictor(network, model.predict_config())(arrays))
        flavour = mlflow.pytorch if model.framework == TORCH else mlflow.tensorflow
        with url_not_printed(), mlflow.start_run(run_id=record.mlflow_run_id,
                                                 nested=mlflow.active_run() is not None):
            info = flavour.log_model(network, name="model", signature=signature,
                                     input_example=example)
        record.mlflow_model_uri = info.model_uri
        return info.model_uri
    except Exception as exc:  # noqa: BLE001 - tracking never fails a fit
        warnings.warn(f"hvd_magics: the fitted model was not logged to MLflow "
                      f"({type(exc).__name__}: {exc})", stacklevel=3)
        return None
