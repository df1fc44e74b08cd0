"""Our own tests of plain (strategy="ar") `generate`, covering what transformers' GenerationTesterMixin checks.

GenerationTesterMixin exists only in transformers' GitHub test tree (tests/generation/test_utils.py), which no
package registry carries, so these tests are written here. They take the core of it (greedy, sampling, beam search
and beam sampling, dict outputs with scores/logits/attentions/hidden states, the cache, left padding, continuing
from a returned cache, inputs_embeds, assisted and prompt-lookup decoding, static cache, eager vs sdpa) and, where
the mixin only checks shapes, also check the values against decoding by hand. Models are float64 copies of the
tester's tiny model, so "equal" means equal. test_transformers_common.py mixes this class into its test classes
(it needs `self.model_tester` and `self.all_generative_model_classes`, as the mixin does).
"""

import copy

import torch
from transformers import DynamicCache, GenerationMixin
from transformers.generation import GenerateBeamDecoderOnlyOutput, GenerateDecoderOnlyOutput

# transformers renamed the cache argument and output field together: `cache` from 5.24 on, `past_key_values` before.
CACHE = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"
NEW = 4  # new tokens per call


class ARGenerationChecks:
    def _model(self, model_class, attn_implementation: str = "sdpa"):
        config = self.model_tester.get_config()
        config.eos_token_id = None  # length checks: nothing stops early
        torch.manual_seed(0)
        model = model_class(config).to(torch.float64).eval()
        model.set_attn_implementation(attn_implementation)
        return model

    def _ids(self, batch: int = 2, length: int | None = None, seed: int = 0) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        length = length or self.model_tester.seq_length
        return torch.randint(1, self.model_tester.vocab_size, (batch, length), generator=g)  # 0 is the pad id

    @staticmethod
    def _greedy_by_hand(model, ids: torch.Tensor, new: int = NEW) -> torch.Tensor:
        """Argmax of a full forward over the sequence so far, one token at a time, no cache."""
        with torch.no_grad():
            for _ in range(new):
                ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return ids

    def test_ar_generate_inherits_generation_mixin_directly(self):
        self.assertTrue(self.all_generative_model_classes)
        for model_class in self.all_generative_model_classes:
            self.assertIn(GenerationMixin, model_class.__bases__)

    def test_ar_greedy_equals_greedy_by_hand_with_and_without_cache(self):
        for model_class in self.all_generative_model_classes:
            model, ids = self._model(model_class), self._ids()
            expected = self._greedy_by_hand(model, ids)
            for use_cache in (True, False):
                out = model.generate(ids, max_new_tokens=NEW, do_sample=False, use_cache=use_cache)
                self.assertTrue(torch.equal(out, expected), f"use_cache={use_cache}")

    def test_ar_greedy_dict_outputs(self):
        """scores, logits, attentions, hidden states and cache: one entry per step, the shapes a cache implies, and
        logits equal to a full forward over the prefix."""
        tester = self.model_tester
        for model_class in self.all_generative_model_classes:
            model, ids = self._model(model_class, "eager"), self._ids()
            batch, length = ids.shape
            for use_cache in (True, False):
                out = model.generate(
                    ids,
                    max_new_tokens=NEW,
                    do_sample=False,
                    use_cache=use_cache,
                    return_dict_in_generate=True,
                    output_scores=True,
                    output_logits=True,
                    output_attentions=True,
                    output_hidden_states=True,
                )
                self.assertIsInstance(out, GenerateDecoderOnlyOutput)
                self.assertEqual(out.sequences.shape, (batch, length + NEW))
                for name in ("scores", "logits", "attentions", "hidden_states"):
                    self.assertEqual(len(getattr(out, name)), NEW, name)
                for t in range(NEW):
                    seen = length + t  # tokens before step t's prediction
                    fed = seen if t == 0 or not use_cache else 1
                    with torch.no_grad():
                        reference = model(out.sequences[:, :seen]).logits[:, -1]
                    torch.testing.assert_close(out.logits[t], reference.float(), rtol=0, atol=1e-6)  # generate: float32
                    self.assertTrue(torch.equal(out.sequences[:, seen], out.scores[t].argmax(-1)))
                    self.assertEqual(len(out.attentions[t]), tester.num_hidden_layers)
                    for layer in out.attentions[t]:
                        self.assertEqual(layer.shape, (batch, tester.num_attention_heads, fed, seen))
                    self.assertEqual(len(out.hidden_states[t]), tester.num_hidden_layers + 1)
                    for layer in out.hidden_states[t]:
                        self.assertEqual(layer.shape, (batch, fed, tester.hidden_size))
                cache = getattr(out, CACHE)
                if not use_cache:
                    self.assertIsNone(cache)
                    continue
                self.assertEqual(cache.get_seq_length(), length + NEW - 1)  # the last token is never fed

    def test_ar_cache_format(self):
        tester = self.model_tester
        for model_class in self.all_generative_model_classes:
            model, ids = self._model(model_class), self._ids(batch=3)
            with torch.no_grad():
                cache = getattr(model(ids, use_cache=True), CACHE)
            self.assertIsInstance(cache, DynamicCache)
            self.assertEqual(len(cache.layers), tester.num_hidden_layers)
            head_dim = tester.get_config().head_dim
            for layer in cache.layers:
                self.assertEqual(layer.keys.shape, (3, tester.num_key_value_heads, ids.shape[1], head_dim))
                self.assertEqual(layer.values.shape, layer.keys.shape)

    def test_ar_sampling(self):
        """Seeded sampling repeats; num_return_sequences repeats each prompt; every sampled token is inside the
        top-k that the processed scores keep; top_k=1 sampling is greedy decoding."""
        for model_class in self.all_generative_model_classes:
            model, ids = self._model(model_class), self._ids()
            kwargs = dict(max_new_tokens=NEW, do_sample=True, top_k=5, temperature=0.7, num_return_sequences=3)
            kwargs |= dict(return_dict_in_generate=True, output_scores=True)
            torch.manual_seed(0)
            first = model.generate(ids, **kwargs)
            torch.manual_seed(0)
            again = model.generate(ids, **kwargs)
            self.assertTrue(torch.equal(first.sequences, again.sequences))
            self.assertEqual(first.sequences.shape, (6, ids.shape[1] + NEW))
            self.assertTrue(torch.equal(first.sequences[:, : ids.shape[1]], ids.repeat_interleave(3, dim=0)))
            for t, scores in enumerate(first.scores):
                self.assertEqual(scores.shape, (6, self.model_tester.vocab_size))
                self.assertTrue(((scores > -torch.inf).sum(-1) <= 5).all())
                chosen = first.sequences[:, ids.shape[1] + t]
                self.assertTrue(torch.isfinite(scores.gather(1, chosen[:, None])).all())
            top1 = model.generate(ids, max_new_tokens=NEW, do_sample=True, top_k=1)
            self.assertTrue(torch.equal(top1, self._greedy_by_hand(model, ids)))

    def test_ar_beam_search_scores_are_sequence_log_probabilities(self):
        for model_class in self.all_generative_model_classes:
            model, ids = self._model(model_class), self._ids()
            out = model.generate(
                ids,
                max_new_tokens=NEW,
                do_sample=False,
                num_beams=3,
                num_return_sequences=2,
                length_penalty=0.0,  # the score is then the plain sum of the new tokens' log-probabilities
                return_dict_in_generate=True,
                output_scores=True,
            )
            self.assertIsInstance(out, GenerateBeamDecoderOnlyOutput)
            self.assertEqual(out.sequences.shape, (4, ids.shape[1] + NEW))
            self.assertEqual(out.sequences_scores.shape, (4,))
            self.assertEqual(out.beam_indices.shape[0], 4)
            with torch.no_grad():
                logprobs = model(out.sequences).logits.log_softmax(-1)[:, ids.shape[1] - 1 : -1]
            new = out.sequences[:, ids.shape[1] :]
            expected = logprobs.gather(2, new[..., None]).squeeze(-1).sum(-1)
            torch.testing.assert_close(out.sequences_scores, expected.float(), rtol=1e-5, atol=1e-5)  # kept in float32
            for row in range(2):  # best first, and two different hypotheses per prompt
                self.assertGreaterEqual(out.sequences_scores[2 * row], out.sequences_scores[2 * row + 1])
                self.assertFalse(torch.equal(out.sequences[2 * row], out.sequences[2 * row + 1]))

    def test_ar_beam_sampling_repeats_with_a_seed(self):
        for model_class in self.all_generative_model_classes:
            model, ids = self._model(model_class), self._ids()
            kwargs = dict(max_new_tokens=NEW, do_sample=True, num_beams=2, num_return_sequences=2, top_k=10)
            outs = []
            for _ in range(2):
                torch.manual_seed(1)
                outs.append(model.generate(ids, **kwargs))
            self.assertEqual(outs[0].shape, (4, ids.shape[1] + NEW))
            self.assertTrue(torch.equal(outs[0], outs[1]))

    def test_ar_left_padded_batch_equals_single_rows(self):
        """Next-token logits do not see left padding, and a padded batch generates what each prompt does alone."""
        for model_class in self.all_generative_model_classes:
            model = self._model(model_class)
            long_, short = self._ids(1, 9, seed=1), self._ids(1, 5, seed=2)
            ids = torch.cat([long_, torch.cat([torch.zeros(1, 4, dtype=torch.long), short], 1)])
            mask = (torch.arange(9) >= torch.tensor([[0], [4]])).long()
            position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
            with torch.no_grad():
                padded = model(ids, attention_mask=mask, position_ids=position_ids).logits[1, -1]
                alone = model(short).logits[0, -1]
            torch.testing.assert_close(padded, alone, rtol=0, atol=1e-10)
            batch = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
            for row, prompt in enumerate((long_, short)):
                single = model.generate(prompt, max_new_tokens=NEW, do_sample=False)
                self.assertTrue(torch.equal(batch[row, 9:], single[0, prompt.shape[1] :]), f"row {row}")

    def test_ar_continue_from_returned_cache(self):
        """Generating N tokens, then N more from the returned sequences and cache, equals generating 2N at once."""
        for model_class in self.all_generative_model_classes:
            model = self._model(model_class)
            ids = self._ids(2, 7)
            ids[1, :3] = 0
            mask = (ids != 0).long()
            whole = model.generate(ids, attention_mask=mask, max_new_tokens=2 * NEW, do_sample=False)
            first = model.generate(
                ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, return_dict_in_generate=True
            )
            longer_mask = torch.cat([mask, torch.ones(2, NEW, dtype=torch.long)], 1)
            cache = {CACHE: getattr(first, CACHE)}
            second = model.generate(
                first.sequences, attention_mask=longer_mask, max_new_tokens=NEW, do_sample=False, **cache
            )
            self.assertTrue(torch.equal(second, whole))

    def test_ar_reuses_a_prefilled_prompt_cache(self):
        """A cache prefilled with a shared prefix gives the same continuation as no cache."""
        for model_class in self.all_generative_model_classes:
            model, ids = self._model(model_class), self._ids(1, 9)
            prefix_cache = DynamicCache(config=model.config)
            with torch.no_grad():
                model(ids[:, :6], **{CACHE: prefix_cache})
            expected = model.generate(ids, max_new_tokens=NEW, do_sample=False)
            for _ in range(2):  # a copy per call: generate extends the cache it is given
                out = model.generate(ids, max_new_tokens=NEW, do_sample=False, **{CACHE: copy.deepcopy(prefix_cache)})
                self.assertTrue(torch.equal(out, expected))

    def test_ar_generate_from_inputs_embeds(self):
        for model_class in self.all_generative_model_classes:
            model, ids = self._model(model_class), self._ids()
            embeds = model.get_input_embeddings()(ids).detach()
            for num_beams in (1, 2):
                kwargs = dict(max_new_tokens=NEW, do_sample=False, num_beams=num_beams)
                kwargs |= dict(return_dict_in_generate=True, output_scores=True)
                from_ids = model.generate(ids, **kwargs)
                from_embeds = model.generate(inputs_embeds=embeds, **kwargs)
                both = model.generate(ids, inputs_embeds=embeds, **kwargs)
                self.assertTrue(torch.equal(from_embeds.sequences, from_ids.sequences[:, ids.shape[1] :]))
                self.assertTrue(torch.equal(both.sequences, from_ids.sequences))
                other = model.generate(ids, inputs_embeds=torch.rand_like(embeds), **kwargs)
                self.assertFalse(torch.allclose(other.scores[0], from_ids.scores[0]))

    def test_ar_assisted_and_prompt_lookup_decoding_equal_greedy(self):
        for model_class in self.all_generative_model_classes:
            model = self._model(model_class)
            ids = self._ids(1, 4).repeat(1, 3)  # repeats: prompt lookup finds candidates
            expected = self._greedy_by_hand(model, ids, new=6)
            assisted = model.generate(ids, max_new_tokens=6, do_sample=False, assistant_model=copy.deepcopy(model))
            lookup = model.generate(ids, max_new_tokens=6, do_sample=False, prompt_lookup_num_tokens=2)
            self.assertTrue(torch.equal(assisted, expected))
            self.assertTrue(torch.equal(lookup, expected))

    def test_ar_static_cache_sdpa_eager_and_logits_to_keep_agree(self):
        """Static cache, eager attention and logits for every position change nothing in greedy decoding."""
        for model_class in self.all_generative_model_classes:
            model, ids = self._model(model_class), self._ids()
            expected = model.generate(ids, max_new_tokens=NEW, do_sample=False)
            static = model.generate(ids, max_new_tokens=NEW, do_sample=False, cache_implementation="static")
            all_logits = model.generate(ids, max_new_tokens=NEW, do_sample=False, logits_to_keep=0)
            eager = self._model(model_class, "eager").generate(ids, max_new_tokens=NEW, do_sample=False)
            for name, out in (("static", static), ("logits_to_keep=0", all_logits), ("eager", eager)):
                self.assertTrue(torch.equal(out, expected), name)

    def test_ar_rows_stop_at_eos_and_are_padded(self):
        for model_class in self.all_generative_model_classes:
            model, ids = self._model(model_class), self._ids()
            width = ids.shape[1]
            free = model.generate(ids, max_new_tokens=NEW, do_sample=False)
            eos = int(free[0, width + 1])  # row 0 stops after at most 2 of its NEW tokens
            out = model.generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=eos, pad_token_id=0)
            for row in range(2):
                hits = (free[row, width:] == eos).nonzero()
                end = width + (int(hits[0]) + 1 if len(hits) else NEW)
                self.assertTrue(torch.equal(out[row, :end], free[row, :end]), f"row {row}")
                self.assertTrue((out[row, end:] == 0).all(), f"row {row}")
            self.assertTrue((out[0, width + 2 :] == 0).all())
