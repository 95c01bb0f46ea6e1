"""The compiled extension on a real GPU: the sm_90a code runs and the device facts agree with torch's."""

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ext():
    from vllm_megakernel import _C

    return _C


def test_device_query_agrees_with_torch(ext):
    info = ext.query_device(0)
    props = torch.cuda.get_device_properties(0)
    assert info["sm_count"] == props.multi_processor_count
    assert tuple(info["capability"]) == (props.major, props.minor)
    assert info["name"] == props.name


def test_sm90a_probe_kernel_runs_on_hopper(ext):
    if torch.cuda.get_device_capability(0) != (9, 0):
        with pytest.raises(RuntimeError, match="probe kernel"):
            ext.probe_kernel_arch(0)
        return
    assert ext.probe_kernel_arch(0) == 900
