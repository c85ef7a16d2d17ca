"""The extension loads in real Jupyter kernels: by %load_ext, and by the opt-in kernelspec."""
import pytest
from jupyter_client.manager import start_new_kernel


def _run(client, code: str) -> str:
    """Execute ``code``; return its text/plain result or its stream output."""
    msg_id = client.execute(code)
    text = []
    while True:
        msg = client.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            text.append(content["text"])
        elif kind == "execute_result":
            text.append(content["data"]["text/plain"])
        elif kind == "error":
            text.append(content["ename"] + ": " + content["evalue"])
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(text)


@pytest.mark.parametrize("kernel, setup", [("python3", "%load_ext hvd_magics"),
                                           ("hvd-magics", "")])
def test_horovod_magic_is_registered_in_a_fresh_kernel(kernel, setup):
    manager, client = start_new_kernel(kernel_name=kernel)
    try:
        before = _run(client, "'horovod' in get_ipython().magics_manager.magics['cell']")
        if setup:
            assert before.strip() == "False"
            _run(client, setup)
        assert _run(client, "'horovod' in get_ipython().magics_manager.magics['cell']").strip() == "True"
        assert _run(client, "%%horovod np=-1 -q\n6 * 7\n").strip() == "42"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
