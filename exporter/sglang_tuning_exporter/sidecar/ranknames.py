"""One server, one rank (docs/sidecar.md): SGLang labels every scheduler series with every rank dimension
(`pp_rank="0",tp_rank="0",moe_ep_rank="0"` at TP=1) while its log names a dimension only when its size is
above 1 (0.4.7+). Scraped ranks drop what the log would not name, so both sources land on one rank."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.core.model import Rank

_RANK_SIZES = (("pp", "pp_size"), ("tp", "tp_size"), ("ep", "ep_size"))


@dataclass(slots=True)
class RankNames:
    """The rank dimensions seen to be of size > 1 (named by the log's prefixes, or above 0 on a scrape), for
    the sizes the server arguments do not give (server info not answered yet, unreachable, an older release)."""

    named: set[str] = field(default_factory=set)

    def note_events(self, events: Iterable[Event]) -> None:
        if len(self.named) < 4:  # dp, pp, tp, ep: nothing left to learn
            for e in events:
                if e.rank:
                    self.named.update(e.rank)

    def note_ranks(self, ranks: Iterable[Rank]) -> None:
        if len(self.named) < 4:
            for r in set(ranks):
                self.named.update(dim for dim, v in (("pp", r.pp), ("tp", r.tp), ("ep", r.ep)) if v)

    def normaliser(self, args: Mapping[str, Any]) -> Callable[[Rank], Rank]:
        """A scraped rank as the log names it: a dimension of size 1 (`pp_size`, `tp_size`, `ep_size` from
        server info or the log's server_args) is dropped; one of unknown size is kept if it was seen named,
        else dropped at rank 0, so a TP=1 server is one rank whichever source answers first."""
        sizes = {dim: v for dim, key in _RANK_SIZES
                 if isinstance(v := args.get(key), (int, float)) and not isinstance(v, bool)}
        single = {dim for dim, v in sizes.items() if v == 1}
        unknown = {dim for dim, _ in _RANK_SIZES if dim not in sizes and dim not in self.named}

        def drop(dim: str, value: int | None) -> bool:
            return dim in single or (dim in unknown and value == 0)

        def norm(rank: Rank) -> Rank:
            if not single and not unknown:
                return rank
            return Rank(dp=rank.dp, pp=None if drop("pp", rank.pp) else rank.pp,
                        tp=None if drop("tp", rank.tp) else rank.tp, ep=None if drop("ep", rank.ep) else rank.ep)
        return norm
