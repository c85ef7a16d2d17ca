"""What the cell says changed in a DataFrame's data between two deals to a pool."""
from hvd_magics.launch.data_identity import DataIdentity, data_identity, describe_change


def _files(*files):
    return DataIdentity((("files", tuple(sorted(files))),), "files")


def test_the_change_names_files_added_removed_and_rewritten():
    old = _files(("a", 1, 10), ("b", 2, 10), ("c", 3, 10))
    assert describe_change(old, _files(("a", 1, 10), ("b", 2, 10), ("c", 3, 10), ("d", 1, 20))) \
        == "its files changed since it was dealt: 1 file added"
    assert describe_change(old, _files(("a", 1, 10), ("b", 5, 30), ("e", 1, 20), ("f", 1, 20))) \
        == "its files changed since it was dealt: 2 files added, 1 removed, 1 rewritten"


def test_a_refreshed_cache_and_other_changes_are_named():
    assert describe_change(DataIdentity((("cache", 3),), "cached"),
                           DataIdentity((("cache", 9),), "cached")) == \
        "Spark refreshed its cache since it was dealt"
    assert describe_change(DataIdentity((("rdd", 3),), "local rows"),
                           DataIdentity((("rdd", 4),), "local rows")) == \
        "its data changed since it was dealt"


def test_what_is_not_a_dataframe_is_unproven_not_an_error():
    identity = data_identity(object())
    assert not identity.proven and "could not be identified (AttributeError)" in identity.why


def test_an_identity_that_proves_nothing_is_the_reason_given():
    unproven = DataIdentity(None, "its plan is not deterministic (rand())")
    proven = DataIdentity((("Range",),), "spark.range")
    assert describe_change(proven, unproven) == unproven.why
    assert describe_change(unproven, proven) == unproven.why
