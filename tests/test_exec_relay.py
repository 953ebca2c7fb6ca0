"""tests/exec_relay_port.py, the port that relays every call to dsv4spec.impl, answers an error
whose message is not ASCII (impl's "positions must be ≥ 0") with a header line that is, so that the
suite receives the ValueError impl raised, not a protocol error (issue 42)."""
import shlex
import sys
from pathlib import Path

import pytest
import torch

from dsv4spec.properties.target import load_target

RELAY = "exec:" + shlex.join([sys.executable, str(Path(__file__).with_name("exec_relay_port.py"))])


def test_a_non_ascii_error_message_comes_back_as_the_error_impl_raised():
    relay = load_target(RELAY)
    try:
        with pytest.raises(ValueError, match=r"index_visible: positions must be \\u2265 0"):
            relay.index_visible(torch.tensor([-1, 3]), 4)
        assert relay.index_visible(torch.tensor([3]), 4).tolist() == [1]       # the port is still in step
    finally:
        relay.provider.close()
