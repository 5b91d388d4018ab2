"""The synthetic-dialect next-word task: offline tokenisation, shared vocabulary, the GPT-2-config model."""

import pytest
import torch

from task.config import parse_settings
from task.data import dataset_info, load_client_data
from task.models import build_model
from task.text import SEQ_LEN, encode, generate, language, tokenizer, vocab_size
from task.train import evaluate, train


def test_tokenizer_is_offline_and_matches_the_declared_vocabulary():
    assert vocab_size() == dataset_info("dialects").num_classes == len(language()["vocab"])
    ids = encode(generate(0, 3, 0.5, seed=1))
    assert ids.shape == (3, SEQ_LEN + 1) and ids.min() > 0  # no [UNK] in the language's own text
    assert tokenizer().encode("zzz-not-a-word").ids == [0]


def test_dialects_share_most_vocabulary_but_differ():
    words = [set(" ".join(generate(d, 200, 0.5, seed=0)).split()) for d in range(3)]
    for a in range(3):
        for b in range(a + 1, 3):
            assert len(words[a] & words[b]) / len(words[a]) > 0.8  # each pair shares most words (84 % here)
    assert words[0] - words[1] and generate(0, 5, 0.5, 3) == generate(0, 5, 0.5, 3)
    with pytest.raises(ValueError, match="dialect-mix"):
        generate(0, 1, 1.5, 0)


def test_client_data_and_model_shapes():
    s = parse_settings({"dataset": "dialects", "partition": "planted-clusters", "num-clusters": 3})
    assert s.model == "gpt2"
    d = load_client_data(s.data, 4, 6)
    assert d.meta["planted-cluster"] == 1 and d.x_train.shape[1] == SEQ_LEN
    torch.testing.assert_close(d.x_train[:, 1:], d.y_train[:, :-1])  # targets are the next tokens
    model = build_model(s.model, s.in_channels, s.image_size, s.num_classes, seed=0)
    assert model(d.x_train[:3]).shape == (3, s.num_classes, SEQ_LEN)
    loss0, _ = evaluate(model, d.x_test, d.y_test)
    train(model, d.x_train, d.y_train, epochs=3, batch_size=16, lr=0.003, optimizer="adam")
    loss1, acc1 = evaluate(model, d.x_test, d.y_test)
    assert loss1 < loss0 and 0.0 <= acc1 <= 1.0
    with pytest.raises(ValueError, match="planted-clusters"):
        parse_settings({"dataset": "dialects", "partition": "dirichlet"})


def test_pretrained_folder_is_used_offline(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=tokenizer(), unk_token="[UNK]")
    tok.save_pretrained(tmp_path)
    cfg = GPT2Config(
        vocab_size=len(tok), n_positions=32, n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
    )
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path)
    s = parse_settings(
        {"dataset": "dialects", "partition": "planted-clusters", "num-clusters": 2, "lm-pretrained": str(tmp_path)}
    )
    assert s.model == f"gpt2:{tmp_path}" and s.num_classes == len(tok)
    model = build_model(s.model, s.in_channels, s.image_size, s.num_classes)
    d = load_client_data(s.data, 0, 2)
    assert model(d.x_train[:2]).shape == (2, len(tok), SEQ_LEN)
    with pytest.raises(ValueError, match="lm-pretrained"):
        load_client_data(
            parse_settings({"dataset": "dialects", "partition": "iid", "lm-pretrained": str(tmp_path / "nope")}).data,
            0,
            2,
        )
