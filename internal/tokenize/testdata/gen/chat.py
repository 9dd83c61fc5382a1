#!/usr/bin/python3
"""Renders the chat golden files of internal/tokenize with a real Jinja2.

    apt-get install -y python3-jinja2
    /usr/bin/python3 internal/tokenize/testdata/gen/chat.py [tokenizers-dir]

For every case of ../chat/cases.json (OpenAI chat request fields) and every template
(Qwen3's and Llama 3's chat_template from tokenizer_config.json, and the templates
written for the tests, ../chat/<name>.jinja, rendered with Llama 3's special tokens), it
writes ../chat/golden_<template>.json:
{"generator": ..., "cases": {case name: {"prompt": text} or {"error": message}}}.

The request is turned into template inputs the way vLLM does (the request model's
_normalize_messages_before: reasoning_content renamed reasoning; vllm/entrypoints/chat_utils.py:
content in the template's content format -- detected from the template's syntax tree as
vllm/renderers/hf.py does -- either text parts joined with "\\n" and null content as "", or a
list of {"type": "text", "text": ...} parts with a tool message's parts joined back into a
string; tool-call arguments parsed from JSON, empty tool_calls dropped, reasoning copied to
reasoning_content; tools as pydantic's model_dump of vLLM's request models) and rendered the
way transformers' apply_chat_template does (ImmutableSandboxedEnvironment with trim_blocks
and lstrip_blocks, loopcontrols, tojson = json.dumps(ensure_ascii=False), raise_exception,
special tokens as variables, continue_final_message cut). This script is an independent
model of those two programs: the Go code must agree with it.
"""

import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
CHAT_DIR = os.path.join(HERE, "..", "chat")
SPECIAL_TOKEN_ATTRIBUTES = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token", "additional_special_tokens"]


def token_content(value):
    if isinstance(value, dict):
        return value.get("content")
    return value


def special_tokens_map(config):
    out = {}
    for attr in SPECIAL_TOKEN_ATTRIBUTES:
        value = config.get(attr)
        if attr == "additional_special_tokens" and value:
            value = [token_content(v) for v in value]
        else:
            value = token_content(value)
        if value:
            out[attr] = value
    return out


# --- vLLM: the template's content format --------------------------------------------

def _reads(node, name, key=None):
    """Whether the expression is the variable `name` (or its member `key`: name.key or
    name['key']), possibly filtered, tested or sliced, any number of times."""
    while True:
        if isinstance(node, nodes.Filter) and node.node is not None:
            node = node.node
        elif isinstance(node, nodes.Test):
            node = node.node
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
            node = node.node
        else:
            break
    if key is not None:
        if isinstance(node, nodes.Getattr) and node.attr == key:
            node = node.node
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and node.arg.value == key:
            node = node.node
        else:
            return False
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name


class _NotAName(Exception):
    pass


def _name_of(target):
    if not isinstance(target, nodes.Name):
        raise _NotAName()
    return target.name


def content_format(source):
    """'openai' when the template loops over a message's content, else 'string'.

    The message lists are `messages` and the variables {% set %} binds to one (followed
    breadth first, each once); the message variables are the targets of loops over a
    message list; the template is 'openai' when a loop goes over a message variable's
    content. A set or loop target on the way that is not a plain name, or a template
    Jinja2 cannot parse, gives 'string'."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    try:
        tree = env.parse(source)
        lists = ["messages"]
        for name in lists:
            for assign in tree.find_all(nodes.Assign):
                if _reads(assign.node, name):
                    target = _name_of(assign.target)
                    if target not in lists:
                        lists.append(target)
        message_vars = []
        for loop in tree.find_all(nodes.For):
            if any(_reads(loop.iter, name) for name in lists):
                message_vars.append(_name_of(loop.target))
        for loop in tree.find_all(nodes.For):
            if any(_reads(loop.iter, name, "content") for name in message_vars):
                _name_of(loop.target)
                return "openai"
    except (jinja2.TemplateSyntaxError, _NotAName):
        pass
    return "string"


# --- vLLM: request messages -> conversation -------------------------------------------

TEXT_PART_FIELDS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}


def text_parts(content):
    """The texts of the content's parts (a string is one part, null none); parts whose
    text is null are skipped."""
    if content is None:
        parts = []
    elif isinstance(content, str):
        parts = [content]
    else:
        parts = content
    texts = []
    for part in parts:
        text = part if isinstance(part, str) else part.get(TEXT_PART_FIELDS[part["type"]])
        if text is not None:
            texts.append(text)
    return texts


def parse_content(role, content, fmt):
    texts = text_parts(content)
    if fmt == "string":
        return "\n".join(t for t in texts if t)
    if role == "tool":
        # vLLM gives a tool message's text parts back as one string.
        return "\n".join(texts)
    return [{"type": "text", "text": t} for t in texts]


def tool_call_param(call):
    # pydantic validates the request's TypedDicts: keys in the TypedDict's field order.
    return {"id": call.get("id"), "function": {"arguments": call["function"].get("arguments"), "name": call["function"]["name"]}, "type": call.get("type", "function")}


def normalize_messages(messages):
    """The request model's validator: reasoning_content is renamed reasoning (which it
    does not replace)."""
    out = []
    for m in messages:
        m = dict(m)
        reasoning_content = m.pop("reasoning_content", None)
        if reasoning_content is not None and m.get("reasoning") is None:
            m["reasoning"] = reasoning_content
        out.append(m)
    return out


def conversation(messages, fmt):
    out = []
    for m in normalize_messages(messages):
        role = m["role"]
        msg = {"role": role, "content": parse_content(role, m.get("content"), fmt)}
        if role == "assistant":
            if m.get("tool_calls") is not None:
                msg["tool_calls"] = [tool_call_param(c) for c in m["tool_calls"]]
            if m.get("reasoning") is not None:
                msg["reasoning"] = m["reasoning"]
                msg["reasoning_content"] = m["reasoning"]
        elif role == "tool":
            if "tool_call_id" in m:
                msg["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        if role == "developer":
            msg["tools"] = m.get("tools")
        out.append(msg)
    # _postprocess_messages
    for msg in out:
        if msg["role"] == "assistant" and isinstance(msg.get("tool_calls"), list):
            if len(msg["tool_calls"]) == 0:
                msg.pop("tool_calls")
                continue
            for item in msg["tool_calls"]:
                args = item["function"].get("arguments")
                if isinstance(args, str):
                    try:
                        item["function"]["arguments"] = json.loads(args)
                    except json.JSONDecodeError:
                        item["function"]["arguments"] = {}
                elif not isinstance(args, (dict, list)):
                    item["function"]["arguments"] = {}
    return out


def tool_dump(tool):
    # ChatCompletionToolsParam(type, function: FunctionDefinition(name, description,
    # parameters)) with extra fields allowed; model_dump() puts fields first, extras after.
    fn = tool["function"]
    fn_out = {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters")}
    for k, v in fn.items():
        if k not in fn_out:
            fn_out[k] = v
    out = {"type": tool.get("type", "function"), "function": fn_out}
    for k, v in tool.items():
        if k not in out:
            out[k] = v
    return out


# --- transformers: apply_chat_template ---------------------------------------------------

def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def compile_template(source):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def apply_chat_template(template, fmt, specials, case):
    chat = conversation(case["messages"], fmt)
    tools = [tool_dump(t) for t in case["tools"]] if case.get("tools") is not None else None
    kwargs = dict(specials)
    kwargs.update(case.get("chat_template_kwargs") or {})
    rendered = template.render(messages=chat, tools=tools, documents=None, add_generation_prompt=case.get("add_generation_prompt", False), **kwargs)
    if case.get("continue_final_message"):
        final = chat[-1]["content"]
        if isinstance(final, list):
            # transformers continues the last text part.
            texts = [part["text"] for part in final if "text" in part]
            if not texts:
                raise ValueError("continue_final_message is set but we could not find any text to continue in the final message")
            final = texts[-1]
        if final.strip() not in rendered:
            raise ValueError("continue_final_message is set but the final message does not appear in the chat")
        loc = rendered.rindex(final.strip())
        if rendered[loc : loc + len(final.lstrip())] == final:
            rendered = rendered[: loc + len(final.lstrip())]
        else:
            rendered = rendered[: loc + len(final.strip())]
    return rendered


# The templates written for the tests, rendered with Llama 3's special tokens.
TEST_TEMPLATES = ("features", "parts", "pyvalues", "whitespace")


def main():
    tok_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "..", "..", ".cache", "tokenizers")
    with open(os.path.join(CHAT_DIR, "cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    configs = {}
    for model in ("qwen3", "llama3"):
        with open(os.path.join(tok_dir, model, "tokenizer_config.json"), encoding="utf-8") as f:
            configs[model] = json.load(f)
    templates = {
        "qwen3": (configs["qwen3"]["chat_template"], configs["qwen3"]),
        "llama3": (configs["llama3"]["chat_template"], configs["llama3"]),
    }
    for name in TEST_TEMPLATES:
        with open(os.path.join(CHAT_DIR, name + ".jinja"), encoding="utf-8") as f:
            templates[name] = (f.read(), configs["llama3"])
    for name, (source, config) in templates.items():
        template = compile_template(source)
        fmt = content_format(source)
        specials = special_tokens_map(config)
        golden = {"generator": "jinja2 %s (python %s)" % (jinja2.__version__, sys.version.split()[0]), "content_format": fmt, "cases": {}}
        for case in cases:
            try:
                golden["cases"][case["name"]] = {"prompt": apply_chat_template(template, fmt, specials, case)}
            except Exception as e:  # the test only checks that Go fails too
                golden["cases"][case["name"]] = {"error": "%s: %s" % (type(e).__name__, e)}
        with open(os.path.join(CHAT_DIR, "golden_%s.json" % name), "w", encoding="utf-8") as f:
            json.dump(golden, f, ensure_ascii=False, indent=1, sort_keys=True)
            f.write("\n")
        print("%s: %s content, %d cases" % (name, fmt, len(cases)))
    # The content format of the detection table's templates.
    with open(os.path.join(CHAT_DIR, "content_formats.json"), encoding="utf-8") as f:
        table = json.load(f)
    golden = {"generator": "jinja2 %s (python %s)" % (jinja2.__version__, sys.version.split()[0]),
              "formats": {t["name"]: content_format(t["template"]) for t in table}}
    with open(os.path.join(CHAT_DIR, "golden_content_formats.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1, sort_keys=True)
        f.write("\n")
    print("content formats: %d templates" % len(table))


if __name__ == "__main__":
    main()
