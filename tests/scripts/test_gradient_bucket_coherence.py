"""scripts/gradient_bucket_coherence.py: a bucket's norm split into its groups' mean norm and coherence."""
import json
import math

import pytest

from scripts import gradient_bucket_coherence as coherence_script


def _checkpoint(group_vectors, tokens, sizes, loss_agg="token-mean"):
    """A gradient_buckets checkpoint whose bucket norms are the token-weighted sums of 2-d group vectors."""
    points, buckets, start = [], [], 0
    for number, size in enumerate(sizes, start=1):
        members = list(range(start, start + size))
        start += size
        weights = [tokens[g] if loss_agg == "token-mean" else 1 for g in members]
        total = sum(weights)
        summed = [sum(w * group_vectors[g][k] for w, g in zip(weights, members)) / total for k in range(2)]
        buckets.append({"bucket": f"bucket_{number}", "groups": size, "mean_variance": 0.1 * number,
                        "task_norm": math.hypot(*summed)})
        points += [{"reward_std": 0.3, "tokens": tokens[g], "task_norm": math.hypot(*group_vectors[g])} for g in members]
    return {"step": 5, "advantage": "dr_grpo", "loss_agg": loss_agg, "buckets": buckets, "group_points": points}


def test_aligned_groups_have_coherence_one_and_opposed_ones_less():
    vectors = [(1, 0), (3, 0), (1, 0), (0, 2)]  # bucket 1 points one way; bucket 2's groups at right angles
    result = coherence_script.checkpoint_coherence(_checkpoint(vectors, [10, 30, 20, 20], [2, 2]), "test")
    first, second = result["buckets"]
    assert first["group_norm"] == pytest.approx((10 * 1 + 30 * 3) / 40)
    assert first["coherence"] == pytest.approx(1.0)
    assert second["group_norm"] == pytest.approx(1.5)
    assert second["coherence"] == pytest.approx(math.hypot(0.5, 1.0) / 1.5)
    assert result["least_coherent_bucket"] == result["last_bucket"] == "bucket_2"
    assert result["task_norm_nondecreasing"] is False and result["group_norm_nondecreasing"] is False


def test_sequence_weighted_aggregation_weighs_groups_equally():
    vectors = [(1, 0), (3, 0)]
    result = coherence_script.checkpoint_coherence(_checkpoint(vectors, [10, 30], [2], "seq-mean-token-mean"), "t")
    assert result["buckets"][0]["group_norm"] == pytest.approx(2.0)
    assert result["buckets"][0]["coherence"] == pytest.approx(1.0)


def test_groups_that_do_not_add_up_to_their_bucket_are_refused():
    checkpoint = _checkpoint([(1, 0), (1, 0)], [10, 10], [2])
    checkpoint["buckets"][0]["task_norm"] = 5.0  # larger than any mix of norms 1 and 1 can give
    with pytest.raises(coherence_script.CoherenceError, match="do not match"):
        coherence_script.checkpoint_coherence(checkpoint, "test")
    checkpoint["group_points"].pop()
    with pytest.raises(coherence_script.CoherenceError, match="group_points 1"):
        coherence_script.checkpoint_coherence(checkpoint, "test")


def test_main_writes_counts_and_its_command_and_refuses_other_files(tmp_path, capsys):
    bucket_file = tmp_path / "gradient_buckets_seed3.json"
    bucket_file.write_text(json.dumps({"seed": 3, "checkpoints": [
        _checkpoint([(1, 0), (0, 1), (2, 0), (1, 0)], [5, 5, 5, 5], [2, 2])]}))
    out = tmp_path / "coherence.json"
    assert coherence_script.main([str(bucket_file), "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["command"].startswith("python scripts/gradient_bucket_coherence.py ")
    assert written["counts"]["dr_grpo"] == {"checkpoints": 1, "task_norm_nondecreasing": 1,
                                            "group_norm_nondecreasing": 1, "least_coherent_is_last": 0}
    first, second = written["runs"][0]["checkpoints"][0]["buckets"]
    assert first["coherence"] == pytest.approx(math.sqrt(0.5)) and second["coherence"] == pytest.approx(1.0)
    fit_file = tmp_path / "gradient_buckets_fit.json"
    fit_file.write_text(json.dumps({"fit": {}}))
    with pytest.raises(SystemExit, match="not a scripts/gradient_buckets.py output"):
        coherence_script.main([str(fit_file)])
    with pytest.raises(SystemExit, match="not found"):
        coherence_script.main([str(tmp_path / "missing.json")])
