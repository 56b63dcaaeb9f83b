"""rillet: stream LLM responses from many providers through one checked trio pipeline.

Everything a host uses is here: the turn (`run_turn`, `open_turn`, `TurnRequest`, `Policy`), the
agent loop (`run_agent`, `open_agent`, `tool`, `Conversation`, `ContextBudget`), the chain's
breakers and admission, MMSP's UniEvents and the public run events, the hub that fans run events
out, and every typed error. Provider dialects and the registry are in `rillet.providers`; what
code extending rillet builds on (the lane events, the grammar, the wire decoder, the accumulator,
the handler's markers, the upstream protocol) in `rillet.lowlevel`; frame codecs, sinks, the
server, replay and the loopback test provider in `rillet.transports`; the Redis hub in
`rillet.redis`.
"""

import typing as _typing
from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

from . import lowlevel as lowlevel
from ._agent._loop import Agent as Agent
from ._agent._loop import AgentOptions as AgentOptions
from ._agent._loop import AgentResult as AgentResult
from ._agent._loop import AgentStatus as AgentStatus
from ._agent._loop import StepOptions as StepOptions
from ._agent._loop import open_agent as open_agent
from ._agent._loop import run_agent as run_agent
from ._agent._tools import Tool as Tool
from ._agent._tools import ToolOutput as ToolOutput
from ._agent._tools import ToolStatus as ToolStatus
from ._agent._tools import tool as tool
from ._core._budget import ContextBudget as ContextBudget
from ._core._budget import estimate_chars as estimate_chars
from ._core._codes import RUN_CODES as RUN_CODES
from ._core._codes import CodeInfo as CodeInfo
from ._core._conversation import Conversation as Conversation
from ._core._conversation import PendingApproval as PendingApproval
from ._core._cost import GenAIPrices as GenAIPrices
from ._core._cost import Price as Price
from ._core._cost import Prices as Prices
from ._core._cost import PriceTable as PriceTable
from ._core._cost import TokenUsage as TokenUsage
from ._core._cost import usage_cost as usage_cost
from ._core._errors import AppendConflict as AppendConflict
from ._core._errors import AuthenticationError as AuthenticationError
from ._core._errors import ConfigurationError as ConfigurationError
from ._core._errors import ContextWindowExceeded as ContextWindowExceeded
from ._core._errors import CostLimitExceeded as CostLimitExceeded
from ._core._errors import CursorExpired as CursorExpired
from ._core._errors import CursorInvalid as CursorInvalid
from ._core._errors import EmptyResponseError as EmptyResponseError
from ._core._errors import EventStreamFrameError as EventStreamFrameError
from ._core._errors import FrameEncodingError as FrameEncodingError
from ._core._errors import FrameError as FrameError
from ._core._errors import FrameTooLarge as FrameTooLarge
from ._core._errors import HubError as HubError
from ._core._errors import HubUnavailable as HubUnavailable
from ._core._errors import IncompleteStreamError as IncompleteStreamError
from ._core._errors import InvalidRequestError as InvalidRequestError
from ._core._errors import MalformedFrameError as MalformedFrameError
from ._core._errors import NoHistoryError as NoHistoryError
from ._core._errors import OverloadedError as OverloadedError
from ._core._errors import ProviderError as ProviderError
from ._core._errors import RateLimitError as RateLimitError
from ._core._errors import RescueFailed as RescueFailed
from ._core._errors import RilletError as RilletError
from ._core._errors import RunExists as RunExists
from ._core._errors import RunFailed as RunFailed
from ._core._errors import ServerError as ServerError
from ._core._errors import SSEEncodeError as SSEEncodeError
from ._core._errors import SSEErrorField as SSEErrorField
from ._core._errors import StreamError as StreamError
from ._core._errors import StreamProtocolError as StreamProtocolError
from ._core._errors import SubscriberDropped as SubscriberDropped
from ._core._errors import ToolCallArgumentParseError as ToolCallArgumentParseError
from ._core._errors import TransportError as TransportError
from ._core._errors import TurnTimeout as TurnTimeout
from ._core._errors import UnknownRun as UnknownRun
from ._core._errors import UnsupportedContentError as UnsupportedContentError
from ._core._errors import UnsupportedOperationError as UnsupportedOperationError
from ._core._errors import UpstreamError as UpstreamError
from ._core._events import ContentItem as ContentItem
from ._core._events import DeltaItem as DeltaItem
from ._core._events import DoneItem as DoneItem
from ._core._events import EmbeddingDelta as EmbeddingDelta
from ._core._events import EmbeddingDone as EmbeddingDone
from ._core._events import EventItem as EventItem
from ._core._events import FinishReason as FinishReason
from ._core._events import ImageUrlDone as ImageUrlDone
from ._core._events import InlineDataDelta as InlineDataDelta
from ._core._events import InlineDataDone as InlineDataDone
from ._core._events import InlineThinkingDelta as InlineThinkingDelta
from ._core._events import InlineThinkingDone as InlineThinkingDone
from ._core._events import TextDelta as TextDelta
from ._core._events import TextDone as TextDone
from ._core._events import ThinkingDelta as ThinkingDelta
from ._core._events import ThinkingDone as ThinkingDone
from ._core._events import ToolCallDelta as ToolCallDelta
from ._core._events import ToolCallDone as ToolCallDone
from ._core._events import ToolResultDone as ToolResultDone
from ._core._events import UniEvent as UniEvent
from ._core._events import UniMessage as UniMessage
from ._core._events import UsageMetadata as UsageMetadata
from ._core._events import decode_uni_event as decode_uni_event
from ._core._events import decode_uni_message as decode_uni_message
from ._core._events import encode_json as encode_json
from ._core._explain import explain as explain
from ._core._policy import Outcome as Outcome
from ._core._policy import Policy as Policy
from ._core._public import fixup_module_metadata as _fixup_module_metadata
from ._core._request import ThinkingLevel as ThinkingLevel
from ._core._request import ToolChoice as ToolChoice
from ._core._request import ToolSpec as ToolSpec
from ._core._request import TurnRequest as TurnRequest
from ._core._request import user as user
from ._core._runevents import AnswerDelta as AnswerDelta
from ._core._runevents import AnswerDone as AnswerDone
from ._core._runevents import ApprovalRequired as ApprovalRequired
from ._core._runevents import ApprovalResolved as ApprovalResolved
from ._core._runevents import AttemptResetEvent as AttemptResetEvent
from ._core._runevents import ReasoningDelta as ReasoningDelta
from ._core._runevents import RunDone as RunDone
from ._core._runevents import RunEvent as RunEvent
from ._core._runevents import RunStarted as RunStarted
from ._core._runevents import StatusEvent as StatusEvent
from ._core._runevents import ToolCallReady as ToolCallReady
from ._core._runevents import ToolCallStarted as ToolCallStarted
from ._core._runevents import ToolCompleted as ToolCompleted
from ._core._runevents import ToolStarted as ToolStarted
from ._core._runevents import UsageEvent as UsageEvent
from ._core._runevents import decode_run_event as decode_run_event
from ._hub._hub import Entry as Entry
from ._hub._hub import Hub as Hub
from ._hub._hub import HubSink as HubSink
from ._hub._hub import MemoryRunLog as MemoryRunLog
from ._hub._hub import RunHub as RunHub
from ._hub._hub import RunLog as RunLog
from ._hub._hub import RunState as RunState
from ._hub._hub import Subscription as Subscription
from ._turn._admission import DEFAULT_STREAMS as DEFAULT_STREAMS
from ._turn._admission import Admission as Admission
from ._turn._admission import shared_admission as shared_admission
from ._turn._api import TurnOptions as TurnOptions
from ._turn._api import open_turn as open_turn
from ._turn._api import run_turn as run_turn
from ._turn._breakers import BreakerState as BreakerState
from ._turn._breakers import CircuitBreaker as CircuitBreaker
from ._turn._breakers import CircuitBreakers as CircuitBreakers
from ._turn._breakers import shared_breakers as shared_breakers
from ._turn._options import RunOptions as RunOptions
from ._turn._ratelimit import RateLimiter as RateLimiter
from ._turn._telemetry import Telemetry as Telemetry
from ._turn._turn import CallbackSink as CallbackSink
from ._turn._turn import Sink as Sink
from ._turn._turn import SinkBatch as SinkBatch
from ._turn._turn import Turn as Turn
from ._turn._turn import TurnResult as TurnResult
from ._turn._turn import UniItem as UniItem

if _typing.TYPE_CHECKING:
    # moved to `rillet.lowlevel`: still here for type checkers for one release (`__getattr__`)
    from .lowlevel import Accumulator as Accumulator
    from .lowlevel import AttemptReset as AttemptReset
    from .lowlevel import DeltaRun as DeltaRun
    from .lowlevel import Exchange as Exchange
    from .lowlevel import Grammar as Grammar
    from .lowlevel import LaneEvent as LaneEvent
    from .lowlevel import LaneKind as LaneKind
    from .lowlevel import MessageDelta as MessageDelta
    from .lowlevel import MessageStart as MessageStart
    from .lowlevel import MessageStop as MessageStop
    from .lowlevel import PartDelta as PartDelta
    from .lowlevel import PartRun as PartRun
    from .lowlevel import PartStart as PartStart
    from .lowlevel import PartStop as PartStop
    from .lowlevel import Ping as Ping
    from .lowlevel import ProviderErrorEvent as ProviderErrorEvent
    from .lowlevel import RawUsage as RawUsage
    from .lowlevel import Status as Status
    from .lowlevel import Upstream as Upstream
    from .lowlevel import WireDecoder as WireDecoder
    from .lowlevel import map_finish_reason as map_finish_reason

try:
    __version__: str = _version("rillet")
    """The installed distribution's version (`rillet --version` prints it)."""
except _PackageNotFoundError:  # pragma: no cover - only a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "DEFAULT_STREAMS",
    "RUN_CODES",
    "Admission",
    "Agent",
    "AgentOptions",
    "AgentResult",
    "AgentStatus",
    "AnswerDelta",
    "AnswerDone",
    "AppendConflict",
    "ApprovalRequired",
    "ApprovalResolved",
    "AttemptResetEvent",
    "AuthenticationError",
    "BreakerState",
    "CallbackSink",
    "CircuitBreaker",
    "CircuitBreakers",
    "CodeInfo",
    "ConfigurationError",
    "ContentItem",
    "ContextBudget",
    "ContextWindowExceeded",
    "Conversation",
    "CostLimitExceeded",
    "CursorExpired",
    "CursorInvalid",
    "DeltaItem",
    "DoneItem",
    "EmbeddingDelta",
    "EmbeddingDone",
    "EmptyResponseError",
    "Entry",
    "EventItem",
    "EventStreamFrameError",
    "FinishReason",
    "FrameEncodingError",
    "FrameError",
    "FrameTooLarge",
    "GenAIPrices",
    "Hub",
    "HubError",
    "HubSink",
    "HubUnavailable",
    "ImageUrlDone",
    "IncompleteStreamError",
    "InlineDataDelta",
    "InlineDataDone",
    "InlineThinkingDelta",
    "InlineThinkingDone",
    "InvalidRequestError",
    "MalformedFrameError",
    "MemoryRunLog",
    "NoHistoryError",
    "Outcome",
    "OverloadedError",
    "PendingApproval",
    "Policy",
    "Price",
    "PriceTable",
    "Prices",
    "ProviderError",
    "RateLimitError",
    "RateLimiter",
    "ReasoningDelta",
    "RescueFailed",
    "RilletError",
    "RunDone",
    "RunEvent",
    "RunExists",
    "RunFailed",
    "RunHub",
    "RunLog",
    "RunOptions",
    "RunStarted",
    "RunState",
    "SSEEncodeError",
    "SSEErrorField",
    "ServerError",
    "Sink",
    "SinkBatch",
    "StatusEvent",
    "StepOptions",
    "StreamError",
    "StreamProtocolError",
    "SubscriberDropped",
    "Subscription",
    "Telemetry",
    "TextDelta",
    "TextDone",
    "ThinkingDelta",
    "ThinkingDone",
    "ThinkingLevel",
    "TokenUsage",
    "Tool",
    "ToolCallArgumentParseError",
    "ToolCallDelta",
    "ToolCallDone",
    "ToolCallReady",
    "ToolCallStarted",
    "ToolChoice",
    "ToolCompleted",
    "ToolOutput",
    "ToolResultDone",
    "ToolSpec",
    "ToolStarted",
    "ToolStatus",
    "TransportError",
    "Turn",
    "TurnOptions",
    "TurnRequest",
    "TurnResult",
    "TurnTimeout",
    "UniEvent",
    "UniItem",
    "UniMessage",
    "UnknownRun",
    "UnsupportedContentError",
    "UnsupportedOperationError",
    "UpstreamError",
    "UsageEvent",
    "UsageMetadata",
    "decode_run_event",
    "decode_uni_event",
    "decode_uni_message",
    "encode_json",
    "estimate_chars",
    "explain",
    "open_agent",
    "open_turn",
    "run_agent",
    "run_turn",
    "shared_admission",
    "shared_breakers",
    "tool",
    "usage_cost",
    "user",
]

_fixup_module_metadata(__name__, globals())

# The names that moved to `rillet.lowlevel`: `rillet.X` still finds them for one release.
_MOVED_TO_LOWLEVEL = frozenset(lowlevel.__all__)

if _typing.TYPE_CHECKING:  # the old name as type checkers see it: no catch-all `__getattr__`
    FallbackFailed = RescueFailed
else:

    def __getattr__(name: str) -> object:
        """The old names, for one release, each with a warning the first time: `FallbackFailed`
        (`RescueFailed`, the same class, so `except FallbackFailed` still catches it) and the
        names that moved to `rillet.lowlevel` (the same objects)."""
        from ._core._deprecated import renamed

        if name == "FallbackFailed":
            renamed("rillet.FallbackFailed", "rillet.RescueFailed")
            return RescueFailed
        if name in _MOVED_TO_LOWLEVEL:
            renamed(f"rillet.{name}", f"rillet.lowlevel.{name}")
            return getattr(lowlevel, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
