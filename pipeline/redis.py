"""The hub on Redis Streams: several servers behind a load balancer share their run logs, so a
browser that reconnects to another server resumes without loss.

Needs the `redis` extra (`pip install 'rillet[redis]'`, which brings `coredis`).
"""

from ._core._public import fixup_module_metadata as _fixup_module_metadata

try:
    import coredis as _coredis  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is installed wherever tests run
    raise ImportError(
        "rillet.redis needs the redis extra: pip install 'rillet[redis]'", name=exc.name
    ) from exc

from ._hub._redis import Claim as Claim
from ._hub._redis import RedisHub as RedisHub
from ._hub._redis import RedisHubSink as RedisHubSink
from ._hub._redis import RedisSubscription as RedisSubscription
from ._hub._redis import open_redis_hub as open_redis_hub

__all__ = ["Claim", "RedisHub", "RedisHubSink", "RedisSubscription", "open_redis_hub"]

_fixup_module_metadata(__name__, globals())
