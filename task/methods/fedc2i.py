"""FedC2I's options (docs/methods/fedc2i.md)."""

from __future__ import annotations

from dataclasses import dataclass

from task.options import OptionSet, option

#: the method and the paper's Table 3 ablations (docs/methods/fedc2i.md): ``client-level`` mixes the whole model
#: by the client-level influence vector lambda only; the ``class-level-*`` variants mix the classifier by the
#: class-level influence matrix Lambda on the extractor averaged by training-set size ("Lambda/g") or on the
#: client's own ("Lambda/l")
VARIANTS = ("full", "client-level", "class-level-averaged-extractor", "class-level-own-extractor")
#: the earlier spellings, two of which differed only by letter case
DEPRECATED_VARIANTS = {
    "lambda-only": "client-level",
    "Lambda-only": "class-level-averaged-extractor",
    "Lambda-local": "class-level-own-extractor",
}


@dataclass(frozen=True)
class FedC2IOptions(OptionSet):
    gamma: float = option(
        "gamma", 5.0, "sharpening exponent of the leave-one-out losses (Eqs. 5, 9); 0 = uniform", minimum=0.0
    )
    peers: int = option(
        "c2i-peers",
        0,
        "models a client receives per round, itself included: 0 = every client, k >= 2 = itself and k - 1 drawn peers",
        minimum=0,
    )
    variant: str = option(
        "c2i-variant",
        "full",
        "the method or one of the paper's ablations",
        choices=VARIANTS,
        aliases=DEPRECATED_VARIANTS,
    )
    influence_batch_size: int = option(
        "influence-batch-size", 32, "samples of the one influence batch per round", minimum=1
    )

    def conflicts(self, settings) -> list[str]:
        problems = []
        if self.peers == 1:
            problems.append(
                "c2i-peers=1 sends a client only its own model, so there is nothing to mix: use 0 (every client) "
                "or a number >= 2"
            )
        if self.variant == "class-level-averaged-extractor" and settings.dp_mode == "local":
            problems.append(
                "c2i-variant='class-level-averaged-extractor' weights the peers' extractors by their training-set "
                "sizes, which local DP does not forward to peers (a size is not noised): use another c2i-variant, "
                f"one of {[v for v in VARIANTS if v != 'class-level-averaged-extractor']}"
            )
        return problems
