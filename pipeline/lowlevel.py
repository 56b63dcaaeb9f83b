"""What code that extends rillet builds on, as `trio.lowlevel` is for code that extends trio.

A host running turns and agents needs none of this: `rillet` has the turn, the agent, the run
events and the errors. This module is for the author of a provider dialect, a sink that reads
the MMSP items, or an upstream transport:

- the lane vocabulary a dialect emits (`LaneEvent`: `MessageStart`, `PartStart`, `PartDelta`,
  `PartRun`, `PartStop`, `MessageDelta`, `MessageStop`, `Ping`, `ProviderErrorEvent`; `LaneKind`,
  `RawUsage`) and `map_finish_reason`, its stop spellings in MMSP's words;
- the machinery that reads lanes: the `Grammar` (lanes in, UniEvents out), the `WireDecoder`
  (a dialect's bytes through its frames and lanes to UniEvents), the `Accumulator` (UniEvents
  into the message), and the `DeltaRun` a grammar may release in place of delta UniEvents;
- the markers the handler sends between UniEvents: `AttemptReset` (what came before is void),
  `Status` (what the handler is doing);
- the upstream protocol: `Upstream` and the `Exchange` it opens (the `UpstreamError` a transport
  raises when it cannot carry one is in `rillet`, with every other error).

The dialect protocol itself (`Dialect`, `StreamDecoder`, `HttpRequest`) stays beside the dialects,
in `rillet.providers`.
"""

from ._core._accumulator import Accumulator as Accumulator
from ._core._finish import map_finish_reason as map_finish_reason
from ._core._grammar import Grammar as Grammar
from ._core._lanes import LaneEvent as LaneEvent
from ._core._lanes import LaneKind as LaneKind
from ._core._lanes import MessageDelta as MessageDelta
from ._core._lanes import MessageStart as MessageStart
from ._core._lanes import MessageStop as MessageStop
from ._core._lanes import PartDelta as PartDelta
from ._core._lanes import PartRun as PartRun
from ._core._lanes import PartStart as PartStart
from ._core._lanes import PartStop as PartStop
from ._core._lanes import Ping as Ping
from ._core._lanes import ProviderErrorEvent as ProviderErrorEvent
from ._core._lanes import RawUsage as RawUsage
from ._core._markers import AttemptReset as AttemptReset
from ._core._markers import DeltaRun as DeltaRun
from ._core._markers import Status as Status
from ._core._public import fixup_module_metadata as _fixup_module_metadata
from ._core._upstream import Exchange as Exchange
from ._core._upstream import Upstream as Upstream
from ._core._wire import WireDecoder as WireDecoder

__all__ = [
    "Accumulator",
    "AttemptReset",
    "DeltaRun",
    "Exchange",
    "Grammar",
    "LaneEvent",
    "LaneKind",
    "MessageDelta",
    "MessageStart",
    "MessageStop",
    "PartDelta",
    "PartRun",
    "PartStart",
    "PartStop",
    "Ping",
    "ProviderErrorEvent",
    "RawUsage",
    "Status",
    "Upstream",
    "WireDecoder",
    "map_finish_reason",
]

_fixup_module_metadata(__name__, globals())
