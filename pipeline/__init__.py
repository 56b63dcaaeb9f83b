"""rillet: stream LLM responses from many providers through one checked trio pipeline.

Layers, bottom up (each imports only from below): `errors`; the UniEvent model (`_events`) and
the lane vocabulary (`_lanes`); the pure grammar and accumulator; `transports` (frame codecs);
the dialects (`providers`); the wire decoder that composes them.
"""

from . import errors as errors
from ._accumulator import Accumulator as Accumulator
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
from ._grammar import Grammar as Grammar
from ._grammar import map_finish_reason as map_finish_reason
from ._handler import AttemptReset as AttemptReset
from ._lanes import LaneEvent as LaneEvent
from ._lanes import LaneKind as LaneKind
from ._lanes import MessageDelta as MessageDelta
from ._lanes import MessageStart as MessageStart
from ._lanes import MessageStop as MessageStop
from ._lanes import PartDelta as PartDelta
from ._lanes import PartStart as PartStart
from ._lanes import PartStop as PartStop
from ._lanes import Ping as Ping
from ._lanes import ProviderErrorEvent as ProviderErrorEvent
from ._lanes import RawUsage as RawUsage
from ._policy import Outcome as Outcome
from ._policy import Policy as Policy
from ._ratelimit import RateLimiter as RateLimiter
from ._request import ThinkingLevel as ThinkingLevel
from ._request import ToolChoice as ToolChoice
from ._request import ToolSpec as ToolSpec
from ._request import TurnRequest as TurnRequest
from ._request import user as user
from ._runevents import RunEvent as RunEvent
from ._runevents import decode_run_event as decode_run_event
from ._turn import CallbackSink as CallbackSink
from ._turn import Sink as Sink
from ._turn import SinkBatch as SinkBatch
from ._turn import Turn as Turn
from ._turn import TurnResult as TurnResult
from ._turn import open_turn as open_turn
from ._turn import run_turn as run_turn
from ._wire import WireDecoder as WireDecoder
from .errors import AuthenticationError as AuthenticationError
from .errors import ConfigurationError as ConfigurationError
from .errors import EmptyResponseError as EmptyResponseError
from .errors import FallbackFailed as FallbackFailed
from .errors import FrameEncodingError as FrameEncodingError
from .errors import FrameError as FrameError
from .errors import FrameTooLarge as FrameTooLarge
from .errors import IncompleteStreamError as IncompleteStreamError
from .errors import InvalidRequestError as InvalidRequestError
from .errors import MalformedFrameError as MalformedFrameError
from .errors import NoHistoryError as NoHistoryError
from .errors import OverloadedError as OverloadedError
from .errors import ProviderError as ProviderError
from .errors import RateLimitError as RateLimitError
from .errors import RilletError as RilletError
from .errors import ServerError as ServerError
from .errors import SSEEncodeError as SSEEncodeError
from .errors import StreamError as StreamError
from .errors import StreamProtocolError as StreamProtocolError
from .errors import ToolCallArgumentParseError as ToolCallArgumentParseError
from .errors import TransportError as TransportError
from .errors import TurnTimeout as TurnTimeout
from .errors import UnsupportedContentError as UnsupportedContentError
from .errors import UnsupportedOperationError as UnsupportedOperationError

__all__ = [
    "Accumulator",
    "AttemptReset",
    "AuthenticationError",
    "CallbackSink",
    "ConfigurationError",
    "ContentItem",
    "DeltaItem",
    "DoneItem",
    "EmbeddingDelta",
    "EmbeddingDone",
    "EmptyResponseError",
    "EventItem",
    "FallbackFailed",
    "FinishReason",
    "FrameEncodingError",
    "FrameError",
    "FrameTooLarge",
    "Grammar",
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
    "MessageDelta",
    "MessageStart",
    "MessageStop",
    "NoHistoryError",
    "Outcome",
    "OverloadedError",
    "PartDelta",
    "PartStart",
    "PartStop",
    "Ping",
    "Policy",
    "ProviderError",
    "ProviderErrorEvent",
    "RateLimitError",
    "RateLimiter",
    "RawUsage",
    "RilletError",
    "RunEvent",
    "SSEEncodeError",
    "ServerError",
    "Sink",
    "SinkBatch",
    "StreamError",
    "StreamProtocolError",
    "TextDelta",
    "TextDone",
    "ThinkingDelta",
    "ThinkingDone",
    "ThinkingLevel",
    "ToolCallArgumentParseError",
    "ToolCallDelta",
    "ToolCallDone",
    "ToolChoice",
    "ToolResultDone",
    "ToolSpec",
    "TransportError",
    "Turn",
    "TurnRequest",
    "TurnResult",
    "TurnTimeout",
    "UniEvent",
    "UniMessage",
    "UnsupportedContentError",
    "UnsupportedOperationError",
    "UsageMetadata",
    "WireDecoder",
    "decode_run_event",
    "decode_uni_event",
    "decode_uni_message",
    "encode_json",
    "errors",
    "map_finish_reason",
    "open_turn",
    "run_turn",
    "user",
]
