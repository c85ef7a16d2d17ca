"""Which ranks may share a zygote (hvd_magics.task.zygotes): only ranks whose environments
differ in what a framework reads once the job runs."""
from hvd_magics.task.zygotes import frameworks, key_of


def test_ranks_differing_only_in_their_own_place_share_a_zygote():
    base = {"PATH": "/usr/bin", "TF_USE_LEGACY_KERAS": "1", "PYTHONPATH": "/pkg"}
    rank0 = {**base, "HOROVOD_RANK": "0", "HVD_MAGICS_RANK": "0", "RANK": "0",
             "MASTER_PORT": "1234", "CUDA_VISIBLE_DEVICES": "0", "TF_CONFIG": "{}"}
    rank1 = {**base, "HOROVOD_RANK": "1", "HVD_MAGICS_RANK": "1", "RANK": "1",
             "MASTER_PORT": "1234", "CUDA_VISIBLE_DEVICES": "1", "TF_CONFIG": "{...}"}
    assert key_of("/venv/bin/python", rank0) == key_of("/venv/bin/python", rank1)


def test_anything_a_framework_may_read_on_import_gets_a_zygote_of_its_own():
    base = {"PATH": "/usr/bin", "TF_USE_LEGACY_KERAS": "1"}
    key = key_of("/venv/bin/python", base)
    assert key_of("/venv/bin/python", {**base, "TF_USE_LEGACY_KERAS": "0"}) != key
    assert key_of("/venv/bin/python", {**base, "OMP_NUM_THREADS": "1"}) != key
    assert key_of("/venv/bin/python", {**base, "KERAS_BACKEND": "torch"}) != key
    assert key_of("/shipped/bin/python", base) != key


def test_a_zygote_imports_only_frameworks_never_the_users_modules():
    assert frameworks(["torch", "horovod.torch", "my_model", "os", "", "tensorflow"], "torch") == {
        "torch", "horovod.torch", "tensorflow"}


def test_a_zygote_holds_at_most_one_of_horovods_bindings():
    """A rank forked from a zygote holding horovod.torch and horovod.tensorflow made collectives
    its fresh peer did not (the second binding's calls went to the first one's Horovod)."""
    from hvd_magics.task.zygotes import binding_of

    both = ["torch", "horovod.torch", "tensorflow", "horovod.tensorflow.keras"]
    assert binding_of(["torch", "horovod.torch"]) == "torch"
    assert binding_of(["horovod.tensorflow.keras", "tensorflow"]) == "tensorflow"
    assert binding_of(both) == binding_of(["torch"]) == ""
    assert frameworks(both, "torch") == {"torch", "horovod.torch", "tensorflow"}
    assert frameworks(both, "tensorflow") == {"torch", "tensorflow", "horovod.tensorflow.keras"}
    assert frameworks(both, "") == {"torch", "tensorflow"}
    python, env = "/venv/bin/python", {"PATH": "/usr/bin"}
    assert key_of(python, env, ["horovod.torch"]) != key_of(python, env, ["horovod.tensorflow"])
