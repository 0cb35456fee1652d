"""examples/llm at toy size on CPU, tilejit's operators through the interpreter: the data is deterministic, a
3-step training run lowers the loss, the loss and gradients at step 0 match the plain-torch twin, decode steps over
the paged cache give the full forward's logits, and generation runs."""
from __future__ import annotations

import json
import math

import pytest
import torch


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


def toy_model(llm, backend="tilejit", seed=0):
    return llm["model"].LlamaModel(llm["model"].LlamaConfig.toy(), backend=backend, seed=seed)


def test_batches_are_deterministic_and_shifted_by_one(llm):
    data = llm["data"]
    files = data.source_files()
    assert files == sorted(files, key=lambda p: p.relative_to(data.stdlib_dir()).as_posix())
    assert not any("site-packages" in p.parts for p in files)
    corpus = data.load_corpus(1 << 16)
    assert corpus.dtype == torch.uint8 and corpus.numel() == 1 << 16
    first, second = data.BatchSampler(corpus, 3, 20, seed=5), data.BatchSampler(corpus, 3, 20, seed=5)
    for _ in range(2):
        (t1, y1), (t2, y2) = first.next(), second.next()
        assert torch.equal(t1, t2) and torch.equal(y1, y2)
        assert t1.shape == (3, 20) and t1.dtype == torch.int64
        assert torch.equal(t1[:, 1:], y1[:, :-1])
    assert not torch.equal(data.BatchSampler(corpus, 3, 20, seed=6).next()[0], first.next()[0])


def test_toy_training_lowers_the_loss_and_writes_its_log(llm, tmp_path):
    log = tmp_path / "loss.json"
    run = llm["train"].main(["--toy", "--steps", "3", "--device", "cpu", "--out", str(log)])
    losses = json.loads(log.read_text())["losses"]
    assert losses == run["losses"] and len(losses) == 3
    assert all(math.isfinite(x) for x in losses)
    assert abs(losses[0] - math.log(256)) < 0.3  # small initial weights: about uniform over the bytes
    assert losses[-1] < losses[0] - 0.3


def test_loss_and_gradients_at_step_0_match_the_torch_twin(llm):
    """Same parameters, same batch. The interpreter rounds float32 products' inputs to tf32 (relative 2^-11,
    as the GPU does), so the loss may differ from torch's float32 by ~1e-4: tolerance 2e-3 on a loss near 5.5;
    gradients agree in direction to cosine 0.999."""
    data = llm["data"]
    tokens, targets = data.BatchSampler(data.load_corpus(1 << 16), 2, 32, seed=1).next()
    losses, grads = {}, {}
    for backend in ("tilejit", "torch"):
        model = toy_model(llm, backend)
        loss = model(tokens, targets)
        loss.backward()
        losses[backend] = loss.item()
        grads[backend] = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert abs(losses["tilejit"] - losses["torch"]) < 2e-3, losses
    cosine = torch.nn.functional.cosine_similarity(grads["tilejit"], grads["torch"], dim=0).item()
    assert cosine > 0.999, cosine
    assert torch.isfinite(grads["tilejit"]).all()


def test_prefill_and_paged_decode_give_the_full_forwards_logits(llm):
    """Prefill 7 tokens, then decode 5 (pages of 4, so positions cross pages in a shuffled block table): each
    step's logits equal the full forward's at that position."""
    model = toy_model(llm, seed=3)
    config = model.config
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model.logits(tokens)
        expected = llm["model"].LlamaModel(config, backend="torch", seed=3).logits(tokens)
        cache = llm["model"].PagedKVCache(config, 2, 12, page_size=4, dtype=torch.float32, device="cpu", seed=2)
        cache.keys.fill_(100.0)  # stale values: a step that read a slot past its position would be far off
        cache.values.fill_(100.0)
        steps = [model.prefill(tokens[:, :7], cache)]
        for pos in range(7, 12):
            positions = torch.full((2,), pos, dtype=torch.int64)
            steps.append(model.decode_step(tokens[:, pos], positions, cache))
    torch.testing.assert_close(full, expected, rtol=0, atol=5e-3)
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 6:], rtol=0, atol=5e-3)
    assert not torch.equal(cache.block_table.flatten(), torch.arange(cache.block_table.numel(), dtype=torch.int32))


def test_generation_runs_on_cpu(llm, capsys):
    tokens = llm["generate"].main(["--toy", "--device", "cpu", "--new-tokens", "3", "--batch", "2",
                                   "--prompt", "import "])
    assert tokens.shape == (2, 3) and tokens.dtype == torch.int64
    assert torch.equal(tokens[0], tokens[1])  # one prompt repeated, greedy: the same continuation
    assert "eager decode on CPU" in capsys.readouterr().out


def test_set_lr_writes_a_capturable_optimizers_tensor_and_replaces_a_float(llm):
    """A captured step reads the learning rate from the tensor it captured: set_lr must write into that tensor
    (a replaced object would leave the graph on the old rate); a plain optimizer gets the float."""
    train = llm["train"]
    model = llm["model"].LlamaModel(llm["model"].LlamaConfig.toy(), backend="torch")
    plain = train.make_optimizer(model, lr=1e-3)
    train.set_lr(plain, 5e-4)
    assert all(group["lr"] == 5e-4 for group in plain.param_groups)
    capturable = train.make_optimizer(model, lr=1e-3, capturable=True)
    rates = [group["lr"] for group in capturable.param_groups]
    assert all(isinstance(rate, torch.Tensor) for rate in rates)
    train.set_lr(capturable, 5e-4)
    assert [group["lr"] for group in capturable.param_groups] == rates  # the same tensors ...
    assert all(abs(rate.item() - 5e-4) < 1e-9 for rate in rates)       # ... holding the new rate


def test_graphed_train_step_refuses_an_optimizer_it_cannot_capture(llm):
    train = llm["train"]
    model = llm["model"].LlamaModel(llm["model"].LlamaConfig.toy(), backend="torch")
    with pytest.raises(ValueError, match="capturable=True"):
        train.GraphedTrainStep(model, train.make_optimizer(model, lr=1e-3))
