"""One line on how to read each view of the app (shown under its heading). Plain text, no markup."""

from __future__ import annotations

HOW_TO_READ: dict[str, str] = {
    "race": "Each column is one strategy on the same prompt; tokens are coloured by how they were produced "
            "(legend above), struck-through ones are drafts the target rejected. The step slider lines the "
            "columns up by target forward passes; the clock replays them by measured wall-clock time.",
    "speed": "Bar height is tokens per second; the label is the speedup over greedy (above 1× is faster).",
    "sources": "How each strategy's tokens were produced: taller green/yellow parts mean more tokens per "
               "target forward.",
    "timeline": "Every forward pass as a bar along the run's own time axis: blue the target, orange the drafter; "
                "a shorter row finished sooner.",
    "breakdown": "Milliseconds per generated token, split into target forwards, draft forwards and the rest: "
                 "drafting pays only when it removes more target time than it adds.",
    "leviathan": "The speedup speculative decoding theory predicts from the measured acceptance α, draft "
                 "length γ and cost ratio c, next to the measured one: a gap means overhead outside forwards.",
    "histogram": "How many drafted tokens the target accepted per verify step: mass to the right means "
                 "long accepted drafts, a tall bar at 0 means wasted drafts.",
    "inspector": "At one verified output position: the target's probability p and the drafter's q of the top "
                 "tokens; a draft is accepted when the target agrees (greedy) or with probability min(1, p/q).",
    "tree": "The draft verified at the replay step: green nodes were accepted, red ones rejected where the "
            "path stopped, grey ones never reached; right: which node may attend to which in that forward.",
    "drafts": "Where copied drafts came from: the earlier text, the matched tokens (orange) and the copied "
              "continuation (kept ones coloured, rejected ones struck through).",
    "crosstok": "An assistant with another tokenizer: its tokens (top) over the target tokens the same bytes "
                "became (bottom), coloured by what the target accepted.",
    "jacobi": "One row per Jacobi iteration (one target forward), one column per output position: green "
              "cells are committed, yellow ones already right before their prefix is verified.",
    "lookahead_window": "The lookahead step at the replay step: its 2D window of guesses and the pooled n-grams "
                        "verified after the key token; the ticked row is the accepted one.",
    "lookahead_mask": "The step's attention mask: rows are queries, columns keys; a coloured cell means the "
                      "row's token may see the column's, coloured by what that key is to it.",
    "lookahead_chart": "Tokens committed per target forward (n-gram hits stacked on the target's own token) "
                       "and the n-gram pool's size (right axis).",
    "beam": "Each dot is a beam's newest token at its position, best beam at the top; red crosses were "
            "pruned, green is the output's path (hover for the cumulative log-probability).",
    "sampling": "One sampled position: the top tokens' probability from the raw logits, after temperature, "
                "and after top-k/top-p (renormalized, what the token was drawn from); ★ marks the drawn one.",
    "sweep": "Speedup over greedy for each setting (a curve for one parameter, a heatmap for two).",
    "trace": "Download the run as JSON, or import one to replay it here with no model.",
}
