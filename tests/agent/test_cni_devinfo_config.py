"""`cniDevinfoDir`: where the agent's in-process CNI service writes Multus device-info files."""

from __future__ import annotations

import pytest

from railyard.agent.config import ConfigError, config_from_dict
from railyard.node.paths import CNI_DEVINFO_DIR


def test_cni_devinfo_dir_defaults_to_multus_cni_folder_and_can_be_moved():
    assert config_from_dict({}).cni_devinfo_dir == CNI_DEVINFO_DIR
    assert CNI_DEVINFO_DIR.endswith("/devinfo/cni")
    assert config_from_dict({"cniDevinfoDir": "/tmp/x"}).cni_devinfo_dir == "/tmp/x"


@pytest.mark.parametrize("bad", ["", 3, None, ["/tmp"]])
def test_cni_devinfo_dir_that_is_not_a_path_is_refused_naming_the_key(bad):
    with pytest.raises(ConfigError, match=r"^cniDevinfoDir: expected a folder path"):
        config_from_dict({"cniDevinfoDir": bad})
