"""The policy server and its client: simulators that connect over TCP (docs/protocol.md).

- :class:`PolicyServerEnv`: an ``ExternalEnv`` a runner samples, whose simulators are
  network clients (``multi_agent=True``: a :class:`PolicyServerMultiAgentEnv`);
- :class:`PolicyClient`: RLlib's ``PolicyClient`` API over the protocol, acting through
  the server (``"remote"``) or with a local copy of the module (``"local"``);
- :class:`BareServer`: the server's I/O loop without an env, for benchmarks.

Needs msgpack (``pip install 'fastrollout[server]'``); ``import fastrollout`` does not.
The user guide is docs/policy_server.md.
"""

from fastrollout.external.client import PolicyClient
from fastrollout.external.protocol import PROTOCOL_VERSION
from fastrollout.external.server import BareServer, PolicyServerEnv, PolicyServerMultiAgentEnv

__all__ = [
    "PROTOCOL_VERSION",
    "BareServer",
    "PolicyClient",
    "PolicyServerEnv",
    "PolicyServerMultiAgentEnv",
]
