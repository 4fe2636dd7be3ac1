"""The one rule for the KV cache's argument name (mi_probe.kv_cache), which the rollout, the
shared-prefix passes and cross-scoring all take."""

from mi_probe.kv_cache import cache_argument


class NewStyle:
    def forward(self, input_ids, attention_mask=None, cache=None, use_cache=False):
        return input_ids


class OldStyle:
    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False):
        return input_ids


def test_the_cache_argument_follows_the_forwards_signature():
    assert cache_argument(NewStyle()) == "cache"
    assert cache_argument(OldStyle()) == "past_key_values"
    assert cache_argument(len) == "past_key_values"  # neither name: the older one
