"""``agreement``: the share of stored greedy answer tokens that are the target's own argmax,
teacher-forced."""

import numpy as np
import pytest

from experiments.drafter_lab.agreement import answer_agreement, next_token_argmax

from spec_fixtures import tiny_pair


def _greedy_rows(tcfg, tparams, prompts, new):
    """Rows written by the target itself: each answer token the argmax after the ones before
    (every row within one 128-wide bucket, so one program writes and checks them)."""
    rows = []
    for prompt in prompts:
        ids = list(prompt)
        for _ in range(new):
            toks = np.zeros((1, 128), np.int32)
            toks[0, :len(ids)] = ids
            ids.append(int(next_token_argmax(tparams, toks, cfg=tcfg)[0, len(ids) - 1]))
        rows.append((np.asarray(ids, np.int32), len(prompt)))
    return rows


def test_the_targets_own_greedy_rows_agree_and_a_changed_token_does_not():
    tcfg, _, params = tiny_pair()
    rows = _greedy_rows(tcfg, params["target"], [[3, 17, 5], [9, 33, 2, 8, 11], [40]], 12)
    got = answer_agreement(tcfg, params["target"], rows, batch=2)
    assert got == {"rows": 3, "tokens": 36, "agree": 36, "rows_same": 3}
    ids, p = rows[1]
    bad = ids.copy()
    bad[p + 4] = (bad[p + 4] + 1) % tcfg.vocab_size   # no longer the argmax
    got = answer_agreement(tcfg, params["target"], [rows[0], (bad, p), rows[2]], batch=2)
    # rows 0 and 2 and row 1's first 4 answer tokens still agree; the changed one does not
    # (the ones after it are judged on the changed context)
    assert got["rows_same"] == 2 and got["tokens"] == 36 and 28 <= got["agree"] <= 35


def test_a_row_without_an_answer_is_refused():
    tcfg, _, params = tiny_pair()
    with pytest.raises(ValueError, match="no answer"):
        answer_agreement(tcfg, params["target"], [(np.arange(4, dtype=np.int32), 4)])
