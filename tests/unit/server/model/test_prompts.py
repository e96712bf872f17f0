"""Prompts: the model directory's (config_sentence_transformers.json), --prompt over them,
the default's rules, the errors that name what is wrong, and sentence-transformers' rule for
putting a prompt before a text."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from bertserve.server import ModelFileError
from bertserve.server.errors import ConfigError, ModelOptionError
from bertserve.server.model.prompts import ST_CONFIG, Prompts, UnknownPrompt, apply_prompt, resolve_prompts
from bertserve.server.model.tokenization import WordPieceTokenizer
from bertserve.server.testing import tiny_bert


@pytest.fixture(scope="module")
def st_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny sentence-transformers directory (modules.json, 1_Pooling, 2_Normalize), no prompts."""
    directory = str(tmp_path_factory.mktemp("tiny_st"))
    return tiny_bert.write_tiny_bert(directory, "huggingface", seed=2, sentence_transformers=True)


@pytest.fixture
def model(st_model: str, tmp_path: Path) -> Path:
    """A copy of the tiny directory this test may change."""
    return Path(shutil.copytree(st_model, tmp_path / "model"))


def _write_st_config(model: Path, content: object) -> None:
    text = content if isinstance(content, str) else json.dumps(content)
    (model / ST_CONFIG).write_text(text, encoding="utf-8")


def _set_pooling(model: Path, **fields: object) -> None:
    path = model / "1_Pooling" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}), encoding="utf-8")


def test_a_directory_without_the_file_has_no_prompts(model: Path) -> None:
    prompts = resolve_prompts(str(model), (), None)
    assert prompts == Prompts(texts={}, default=None)
    assert prompts.text_of(None) == ""
    assert prompts.describe() == {"prompts": {}, "default_prompt_name": None}


def test_the_directory_prompts_and_default(model: Path) -> None:
    _write_st_config(
        model,
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "query", "__version__": {}},
    )
    prompts = resolve_prompts(str(model), (), None)
    assert prompts.texts == {"query": "query: ", "passage": "passage: "}
    assert prompts.default == "query"
    assert prompts.text_of(None) == "query: "
    assert prompts.text_of("passage") == "passage: "
    assert prompts.describe() == {
        "prompts": {"query": "query: ", "passage": "passage: "},
        "default_prompt_name": "query",
    }


def test_a_null_default_and_no_prompts_key(model: Path) -> None:
    _write_st_config(model, {"prompts": {"query": "q: "}, "default_prompt_name": None})
    assert resolve_prompts(str(model), (), None) == Prompts(texts={"query": "q: "}, default=None)
    _write_st_config(model, {"__version__": {"sentence_transformers": "2.0.0"}})
    assert resolve_prompts(str(model), (), None) == Prompts()
    _write_st_config(model, {"prompts": None})
    assert resolve_prompts(str(model), (), None) == Prompts()


def test_flags_add_prompts_and_replace_the_directory_ones_of_their_name(model: Path) -> None:
    _write_st_config(model, {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "query"})
    prompts = resolve_prompts(str(model), ("query=Represent this question: ", " title = a=b "), None)
    # The NAME is stripped; the TEXT is kept as given (its spaces matter), '=' and all.
    assert prompts.texts == {"query": "Represent this question: ", "passage": "passage: ", "title": " a=b "}
    assert prompts.default == "query"
    assert prompts.text_of(None) == "Represent this question: "


def test_the_flag_default_wins_over_the_directory_one(model: Path) -> None:
    _write_st_config(model, {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "query"})
    assert resolve_prompts(str(model), (), "passage").text_of(None) == "passage: "
    assert resolve_prompts(str(model), ("doc=doc: ",), "doc").default == "doc"


def test_flags_alone(model: Path) -> None:
    prompts = resolve_prompts(str(model), ("query=query: ",), None)
    assert prompts == Prompts(texts={"query": "query: "}, default=None)
    assert prompts.text_of(None) == ""
    assert resolve_prompts(str(model), ("query=query: ",), "query").text_of(None) == "query: "


def test_an_unknown_default_name_is_refused(model: Path) -> None:
    with pytest.raises(ModelOptionError, match=r"--default-prompt-name 'query' .* there are no prompts"):
        resolve_prompts(str(model), (), "query")
    _write_st_config(model, {"prompts": {"query": "query: ", "passage": "passage: "}})
    with pytest.raises(ModelOptionError, match=r"'doc' is not a prompt: the prompts are 'passage', 'query'"):
        resolve_prompts(str(model), (), "doc")
    assert issubclass(ModelOptionError, ConfigError)


def test_the_directory_default_must_be_one_of_its_prompts(model: Path) -> None:
    _write_st_config(model, {"prompts": {"query": "query: "}, "default_prompt_name": "passage"})
    with pytest.raises(ModelFileError, match=rf"{ST_CONFIG}: default_prompt_name 'passage' is not one of its prompts"):
        resolve_prompts(str(model), (), None)
    # a flag can supply it, or choose another default
    assert resolve_prompts(str(model), ("passage=passage: ",), None).text_of(None) == "passage: "
    assert resolve_prompts(str(model), (), "query").text_of(None) == "query: "


@pytest.mark.parametrize("flag", ["query", "=query: ", "  =x", ""])
def test_a_malformed_flag_is_refused(model: Path, flag: str) -> None:
    with pytest.raises(ModelOptionError, match=r"--prompt takes NAME=TEXT"):
        resolve_prompts(str(model), (flag,), None)


def test_a_flag_naming_a_prompt_twice_is_refused(model: Path) -> None:
    with pytest.raises(ModelOptionError, match="--prompt names 'query' twice"):
        resolve_prompts(str(model), ("query=a ", "query=b "), None)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"prompts": {"query": "query: "', "is not valid JSON"),
        ('["query: "]', "should hold a JSON object"),
        ({"prompts": ["query: "]}, '"prompts" should be an object of names to texts'),
        ({"prompts": {"query": 1}}, '"prompts" should be an object of names to texts'),
        ({"prompts": {"query": None}}, '"prompts" should be an object of names to texts'),
        ({"prompts": {}, "default_prompt_name": 3}, '"default_prompt_name" should be a string or null'),
    ],
)
def test_a_malformed_file_is_refused(model: Path, content: object, problem: str) -> None:
    _write_st_config(model, content)
    with pytest.raises(ModelFileError, match=problem) as info:
        resolve_prompts(str(model), (), None)
    assert ST_CONFIG in str(info.value)


def test_include_prompt_false_refuses_prompts(model: Path) -> None:
    _set_pooling(model, include_prompt=False)
    assert resolve_prompts(str(model), (), None) == Prompts()  # no prompt: nothing to refuse
    # An empty prompt adds no token, and sentence-transformers skips it: nothing to leave out.
    assert resolve_prompts(str(model), ("none=",), None).texts == {"none": ""}
    with pytest.raises(ModelOptionError, match=r"1_Pooling/config.json sets include_prompt to false"):
        resolve_prompts(str(model), ("query=query: ",), None)
    _write_st_config(model, {"prompts": {"query": "query: "}})
    with pytest.raises(ModelOptionError, match="leaves a prompt's tokens out of this model's pooling"):
        resolve_prompts(str(model), (), None)
    _set_pooling(model, include_prompt=True)
    assert resolve_prompts(str(model), (), None).texts == {"query": "query: "}


def test_include_prompt_is_read_where_modules_json_puts_the_pooling(model: Path) -> None:
    os.rename(model / "1_Pooling", model / "pooling")
    modules = json.loads((model / "modules.json").read_text())
    for module in modules:
        if module["type"].endswith(".Pooling"):
            module["path"] = "pooling"
    (model / "modules.json").write_text(json.dumps(modules))
    (model / "pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_mean_tokens": True, "include_prompt": False})
    )
    with pytest.raises(ModelOptionError, match=r"pooling/config.json sets include_prompt to false"):
        resolve_prompts(str(model), ("query=query: ",), None)


def test_a_malformed_modules_json_is_named(model: Path) -> None:
    (model / "modules.json").write_text("[{")
    with pytest.raises(ModelFileError, match=r"modules\.json"):
        resolve_prompts(str(model), ("query=query: ",), None)


def test_an_unknown_prompt_name_lists_the_known_ones() -> None:
    prompts = Prompts(texts={"query": "query: ", "passage": "passage: "}, default=None)
    with pytest.raises(UnknownPrompt, match=r"unknown prompt_name 'doc': this server's prompts are 'passage', 'query'"):
        prompts.text_of("doc")
    with pytest.raises(UnknownPrompt, match=r"has no prompts \(start it with --prompt NAME=TEXT to add one\)"):
        Prompts().text_of("query")
    assert issubclass(UnknownPrompt, ValueError)


def test_the_default_must_be_a_prompt() -> None:
    with pytest.raises(ValueError, match="'doc' is not one of the prompts"):
        Prompts(texts={"query": "query: "}, default="doc")


def test_describe_is_a_copy() -> None:
    prompts = Prompts(texts={"query": "query: "}, default="query")
    described = prompts.describe()
    described["prompts"]["query"] = "changed"
    assert prompts.text_of("query") == "query: "


def test_apply_prompt_is_sentence_transformers_rule(tiny_hf: str) -> None:
    texts = ["hello world", "the dog ||| a cat"]
    assert apply_prompt(texts, "query: ") == ["query: hello world", "query: the dog ||| a cat"]
    same = apply_prompt(texts, "")
    assert same == texts and same is not texts
    assert apply_prompt([], "query: ") == []
    # A pair gets the prompt before its first side only.
    tokenizer = WordPieceTokenizer(
        vocab_path=os.path.join(tiny_hf, "vocab.txt"), tokenizer_json=None, do_lower_case=True, max_len=32
    )
    batch = tokenizer.tokenize(apply_prompt(["the dog ||| a man"], "my: "), keep_tokens=True)
    assert batch.tokens == [["[CLS]", "my", ":", "the", "dog", "[SEP]", "a", "man", "[SEP]"]]
    assert batch.segment_ids[0].tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1]


@pytest.mark.minilm
def test_all_minilm_l6_v2_has_no_prompts(minilm: str) -> None:
    """Its config_sentence_transformers.json holds versions only."""
    assert resolve_prompts(minilm, (), None) == Prompts()
    assert resolve_prompts(minilm, ("query=query: ",), "query").text_of(None) == "query: "


def test_a_prompt_named_like_an_adapter_chooses_it_and_any_other_none() -> None:
    adapters = ("retrieval.query", "retrieval.passage", "text-matching")
    prompts = Prompts({"retrieval.query": "Represent the query: ", "query": "q: ", "text-matching": ""}, None, adapters)
    assert [prompts.adapter_of(name) for name in ("retrieval.query", "text-matching", "query", None)] == [1, 3, 0, 0]
    assert Prompts({"text-matching": ""}, "text-matching", adapters).adapter_of(None) == 3  # the default's
    assert Prompts({"query": "q: "}, None).adapter_of("query") == 0  # a model without adapters
