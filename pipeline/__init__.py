"""rillet: stream LLM responses from many providers through one checked trio pipeline.

Everything a host uses is here: the turn (`run_turn`, `open_turn`, `TurnRequest`, `Policy`), the
agent loop (`run_agent`, `open_agent`, `tool`, `Conversation`, `ContextBudget`), fallback
breakers and admission, the three vocabularies (lane events, MMSP's UniEvents, the public run
events), the grammar and the accumulator, the hub that fans run events out, and every typed
error. Provider dialects and the registry are in `rillet.providers`; frame codecs, sinks, the
server, replay and the loopback test provider in `rillet.transports`; the Redis hub in
`rillet.redis`.
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

from ._accumulator import Accumulator as Accumulator
from ._admission import DEFAULT_STREAMS as DEFAULT_STREAMS
from ._admission import Admission as Admission
from ._admission import shared_admission as shared_admission
from ._agent import Agent as Agent
from ._agent import AgentOptions as AgentOptions
from ._agent import AgentResult as AgentResult
from ._agent import AgentStatus as AgentStatus
from ._agent import StepOptions as StepOptions
from ._agent import open_agent as open_agent
from ._agent import run_agent as run_agent
from ._budget import ContextBudget as ContextBudget
from ._budget import ContextWindowExceeded as ContextWindowExceeded
from ._budget import estimate_chars as estimate_chars
from ._conversation import Conversation as Conversation
from ._conversation import PendingApproval as PendingApproval
from ._errors import AuthenticationError as AuthenticationError
from ._errors import ConfigurationError as ConfigurationError
from ._errors import EmptyResponseError as EmptyResponseError
from ._errors import FallbackFailed as FallbackFailed
from ._errors import FrameEncodingError as FrameEncodingError
from ._errors import FrameError as FrameError
from ._errors import FrameTooLarge as FrameTooLarge
from ._errors import IncompleteStreamError as IncompleteStreamError
from ._errors import InvalidRequestError as InvalidRequestError
from ._errors import MalformedFrameError as MalformedFrameError
from ._errors import NoHistoryError as NoHistoryError
from ._errors import OverloadedError as OverloadedError
from ._errors import ProviderError as ProviderError
from ._errors import RateLimitError as RateLimitError
from ._errors import RilletError as RilletError
from ._errors import ServerError as ServerError
from ._errors import SSEEncodeError as SSEEncodeError
from ._errors import StreamError as StreamError
from ._errors import StreamProtocolError as StreamProtocolError
from ._errors import ToolCallArgumentParseError as ToolCallArgumentParseError
from ._errors import TransportError as TransportError
from ._errors import TurnTimeout as TurnTimeout
from ._errors import UnsupportedContentError as UnsupportedContentError
from ._errors import UnsupportedOperationError as UnsupportedOperationError
from ._events import ContentItem as ContentItem
from ._events import DeltaItem as DeltaItem
from ._events import DoneItem as DoneItem
from ._events import EmbeddingDelta as EmbeddingDelta
from ._events import EmbeddingDone as EmbeddingDone
from ._events import EventItem as EventItem
from ._events import FinishReason as FinishReason
from ._events import ImageUrlDone as ImageUrlDone
from ._events import InlineDataDelta as InlineDataDelta
from ._events import InlineDataDone as InlineDataDone
from ._events import InlineThinkingDelta as InlineThinkingDelta
from ._events import InlineThinkingDone as InlineThinkingDone
from ._events import TextDelta as TextDelta
from ._events import TextDone as TextDone
from ._events import ThinkingDelta as ThinkingDelta
from ._events import ThinkingDone as ThinkingDone
from ._events import ToolCallDelta as ToolCallDelta
from ._events import ToolCallDone as ToolCallDone
from ._events import ToolResultDone as ToolResultDone
from ._events import UniEvent as UniEvent
from ._events import UniMessage as UniMessage
from ._events import UsageMetadata as UsageMetadata
from ._events import decode_uni_event as decode_uni_event
from ._events import decode_uni_message as decode_uni_message
from ._events import encode_json as encode_json
from ._fallback import BreakerState as BreakerState
from ._fallback import CircuitBreaker as CircuitBreaker
from ._fallback import CircuitBreakers as CircuitBreakers
from ._fallback import shared_breakers as shared_breakers
from ._finish import map_finish_reason as map_finish_reason
from ._grammar import Grammar as Grammar
from ._hub import AppendConflict as AppendConflict
from ._hub import CursorExpired as CursorExpired
from ._hub import CursorInvalid as CursorInvalid
from ._hub import Entry as Entry
from ._hub import Hub as Hub
from ._hub import HubError as HubError
from ._hub import HubSink as HubSink
from ._hub import HubUnavailable as HubUnavailable
from ._hub import MemoryRunLog as MemoryRunLog
from ._hub import RunExists as RunExists
from ._hub import RunHub as RunHub
from ._hub import RunLog as RunLog
from ._hub import RunState as RunState
from ._hub import SubscriberDropped as SubscriberDropped
from ._hub import Subscription as Subscription
from ._hub import UnknownRun as UnknownRun
from ._lanes import LaneEvent as LaneEvent
from ._lanes import LaneKind as LaneKind
from ._lanes import MessageDelta as MessageDelta
from ._lanes import MessageStart as MessageStart
from ._lanes import MessageStop as MessageStop
from ._lanes import PartDelta as PartDelta
from ._lanes import PartRun as PartRun
from ._lanes import PartStart as PartStart
from ._lanes import PartStop as PartStop
from ._lanes import Ping as Ping
from ._lanes import ProviderErrorEvent as ProviderErrorEvent
from ._lanes import RawUsage as RawUsage
from ._markers import AttemptReset as AttemptReset
from ._markers import DeltaRun as DeltaRun
from ._markers import Status as Status
from ._policy import Outcome as Outcome
from ._policy import Policy as Policy
from ._public import fixup_module_metadata as _fixup_module_metadata
from ._ratelimit import RateLimiter as RateLimiter
from ._request import ThinkingLevel as ThinkingLevel
from ._request import ToolChoice as ToolChoice
from ._request import ToolSpec as ToolSpec
from ._request import TurnRequest as TurnRequest
from ._request import user as user
from ._runevents import AnswerDelta as AnswerDelta
from ._runevents import AnswerDone as AnswerDone
from ._runevents import ApprovalRequired as ApprovalRequired
from ._runevents import ApprovalResolved as ApprovalResolved
from ._runevents import AttemptResetEvent as AttemptResetEvent
from ._runevents import ReasoningDelta as ReasoningDelta
from ._runevents import RunDone as RunDone
from ._runevents import RunEvent as RunEvent
from ._runevents import RunStarted as RunStarted
from ._runevents import StatusEvent as StatusEvent
from ._runevents import ToolCallReady as ToolCallReady
from ._runevents import ToolCallStarted as ToolCallStarted
from ._runevents import ToolCompleted as ToolCompleted
from ._runevents import ToolStarted as ToolStarted
from ._runevents import UsageEvent as UsageEvent
from ._runevents import decode_run_event as decode_run_event
from ._tools import Tool as Tool
from ._tools import ToolOutput as ToolOutput
from ._tools import ToolStatus as ToolStatus
from ._tools import tool as tool
from ._turn import CallbackSink as CallbackSink
from ._turn import Sink as Sink
from ._turn import SinkBatch as SinkBatch
from ._turn import Turn as Turn
from ._turn import TurnOptions as TurnOptions
from ._turn import TurnResult as TurnResult
from ._turn import UniItem as UniItem
from ._turn import open_turn as open_turn
from ._turn import run_turn as run_turn
from ._upstream import Exchange as Exchange
from ._upstream import Upstream as Upstream
from ._upstream import UpstreamError as UpstreamError
from ._wire import WireDecoder as WireDecoder

try:
    __version__: str = _version("rillet")
    """The installed distribution's version (`rillet --version` prints it)."""
except _PackageNotFoundError:  # pragma: no cover - only a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "DEFAULT_STREAMS",
    "Accumulator",
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
    "AttemptReset",
    "AttemptResetEvent",
    "AuthenticationError",
    "BreakerState",
    "CallbackSink",
    "CircuitBreaker",
    "CircuitBreakers",
    "ConfigurationError",
    "ContentItem",
    "ContextBudget",
    "ContextWindowExceeded",
    "Conversation",
    "CursorExpired",
    "CursorInvalid",
    "DeltaItem",
    "DeltaRun",
    "DoneItem",
    "EmbeddingDelta",
    "EmbeddingDone",
    "EmptyResponseError",
    "Entry",
    "EventItem",
    "Exchange",
    "FallbackFailed",
    "FinishReason",
    "FrameEncodingError",
    "FrameError",
    "FrameTooLarge",
    "Grammar",
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
    "LaneEvent",
    "LaneKind",
    "MalformedFrameError",
    "MemoryRunLog",
    "MessageDelta",
    "MessageStart",
    "MessageStop",
    "NoHistoryError",
    "Outcome",
    "OverloadedError",
    "PartDelta",
    "PartRun",
    "PartStart",
    "PartStop",
    "PendingApproval",
    "Ping",
    "Policy",
    "ProviderError",
    "ProviderErrorEvent",
    "RateLimitError",
    "RateLimiter",
    "RawUsage",
    "ReasoningDelta",
    "RilletError",
    "RunDone",
    "RunEvent",
    "RunExists",
    "RunHub",
    "RunLog",
    "RunStarted",
    "RunState",
    "SSEEncodeError",
    "ServerError",
    "Sink",
    "SinkBatch",
    "Status",
    "StatusEvent",
    "StepOptions",
    "StreamError",
    "StreamProtocolError",
    "SubscriberDropped",
    "Subscription",
    "TextDelta",
    "TextDone",
    "ThinkingDelta",
    "ThinkingDone",
    "ThinkingLevel",
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
    "Upstream",
    "UpstreamError",
    "UsageEvent",
    "UsageMetadata",
    "WireDecoder",
    "decode_run_event",
    "decode_uni_event",
    "decode_uni_message",
    "encode_json",
    "estimate_chars",
    "map_finish_reason",
    "open_agent",
    "open_turn",
    "run_agent",
    "run_turn",
    "shared_admission",
    "shared_breakers",
    "tool",
    "user",
]

_fixup_module_metadata(__name__, globals())
