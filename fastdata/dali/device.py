"""What DALI runs on: importing DALI, counting CUDA devices, choosing the device.

Nothing here imports torch: it is consulted only when the user's program has
imported it already.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

from fastdata.dali.options import DEVICES
from fastdata.errors import FastDataError

#: The message raised when DALI is missing.
INSTALL_HINT = "NVIDIA DALI is not installed: pip install nvidia-dali-cuda130"


def import_dali() -> tuple[ModuleType, ModuleType, ModuleType]:
    """``(nvidia.dali, nvidia.dali.fn, nvidia.dali.types)``.

    Raises:
        FastDataError: DALI is not installed (the message says how to install it).
    """
    try:
        import nvidia.dali  # noqa: F401  (raises ImportError when missing)
        from nvidia.dali import fn, types
    except ImportError as exc:
        raise FastDataError(INSTALL_HINT) from exc
    return nvidia.dali, fn, types


def cuda_devices() -> int:
    """CUDA devices DALI can use (0 without a GPU or driver)."""
    try:
        from nvidia.dali import backend

        return int(backend.GetCUDADeviceCount())
    except Exception:  # no driver, or an older DALI: ask torch instead
        try:
            import torch

            return torch.cuda.device_count() if torch.cuda.is_available() else 0
        except ImportError:
            return 0


def current_cuda_device() -> int:
    """torch's current CUDA device when torch is loaded, else ``$LOCAL_RANK`` (or 0)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.current_device()
    return int(os.environ.get("LOCAL_RANK", 0))


def resolve_device(device: str, device_id: int | None) -> tuple[str, int | None]:
    """The pipeline's ("gpu", CUDA device) or ("cpu", None) for a ``device`` option.

    Args:
        device: "auto", "gpu" or "cpu".
        device_id: the CUDA device for "gpu"/"auto"; None takes the current one.

    Raises:
        ValueError: an unknown device, or ``device_id`` out of range.
        FastDataError: "gpu" asked for and DALI sees no CUDA device.
    """
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, not {device!r}")
    if device == "cpu":
        return "cpu", None
    gpus = cuda_devices()
    if device == "auto" and gpus == 0:
        return "cpu", None
    if gpus == 0:
        raise FastDataError("device='gpu' needs a CUDA GPU and none is available to DALI; "
                            "use device='cpu' (or 'auto') to run the pipeline on the CPU")
    if device_id is None:
        device_id = current_cuda_device()
    if not 0 <= int(device_id) < gpus:
        raise ValueError(f"device_id {device_id} out of range: {gpus} CUDA device(s)")
    return "gpu", int(device_id)
