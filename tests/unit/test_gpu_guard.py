"""The driver GPU guard. No GPU here: the device file and torch.cuda are simulated (mocked)."""
import re
import sys
import types

from hvd_magics.notebook import gpu_guard


def test_no_gpu_here_and_the_check_imports_nothing():
    import subprocess

    code = ("import sys\nfrom hvd_magics.notebook import gpu_guard\n"
            "assert gpu_guard.driver_gpu_holders() == []\n"
            "print(sorted({'tensorflow', 'torch', 'keras'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"  # looked at the process without loading a framework


def test_an_open_device_file_is_found(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia0"
    fake.write_text("")
    monkeypatch.setattr(gpu_guard, "GPU_DEVICE_PATTERN", re.compile(rf"^{re.escape(str(tmp_path))}/nvidia(\d+)$"))
    with open(fake):
        holders = gpu_guard.driver_gpu_holders()
    assert [h.device for h in holders] == [str(fake)]
    assert "CUDA context" in holders[0].framework


def test_initialised_torch_cuda_is_named(monkeypatch):
    cuda = types.SimpleNamespace(is_initialized=lambda: True, device_count=lambda: 1)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    holders = gpu_guard.driver_gpu_holders()
    message = gpu_guard.driver_gpu_message(holders)
    assert "PyTorch holds cuda:0" in message
    assert "restart the kernel" in message and "--allow-driver-gpu" in message


def test_tensorflow_imported_but_not_initialised_is_not_a_holder():
    import tensorflow  # noqa: F401 - imported on purpose, without touching devices

    assert gpu_guard._tensorflow() == []
