"""The zip hvd_magics travels in (the cluster test runs it on executors without hvd_magics)."""
import zipfile

from hvd_magics.launch import package_shipping
from hvd_magics.task import slots


def test_the_zip_holds_the_package_and_cloudpickle_and_is_built_once_per_content(tmp_path):
    first = package_shipping.package_zip(tmp_path)
    names = zipfile.ZipFile(first).namelist()
    assert "hvd_magics/__init__.py" in names and "hvd_magics/rank/rank_main.py" in names
    assert "cloudpickle/__init__.py" in names and "cloudpickle/cloudpickle.py" in names
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in names)
    stamp = first.stat().st_mtime_ns
    again = package_shipping.package_zip(tmp_path)
    assert again == first and again.stat().st_mtime_ns == stamp  # not rebuilt
    assert list(tmp_path.iterdir()) == [first]  # no partial file left behind


def test_an_executor_without_psutil_still_finds_its_addresses():
    found = dict((address, name) for name, address in slots._ipv4_addresses())
    assert found.get("127.0.0.1") == "lo"
