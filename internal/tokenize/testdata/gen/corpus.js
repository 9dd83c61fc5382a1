// The text corpus the encode golden files are generated from. Every string is tokenized
// by Hugging Face's Rust tokenizers (see encode.js); the Go tests must produce the same ids.
// Categories: prose and contractions, code, CJK and other scripts, emoji, whitespace runs,
// numbers, special and added tokens, normalization (NFD input), control and unusual code
// points, long texts (one of 20,000 characters), and seeded random strings.
'use strict';

const prose = [
  "Hello world",
  "Hello, world!",
  "The quick brown fox jumps over the lazy dog.",
  "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
  "It's a dog's life; we're sure they've done it, I'm told you'll see, he'd agree.",
  "IT'S WE'RE THEY'VE I'M YOU'LL HE'D DON'T",
  "It'S wE'Re tHeY'vE i'M yOu'Ll hE'd",
  "x's x't x're x've x'm x'll x'd",
  "'s 't 're 've 'm 'll 'd",
  "''s '''t 'ss 'tt 'rea 'vee 'mm 'lll 'dd",
  "rock'n'roll o'clock y'all ma'am",
  "x'ſ x'ſt 'ſ ſ",
  "x'K x'\u212a",
  "She said \"yes\" and then 'no'.",
  "  leading spaces",
  "trailing spaces   ",
  "a b  c   d    e     f",
  "Mr. Smith went to Washington, D.C., on Jan. 5th.",
  "e.g. i.e. etc. vs. a.m. p.m.",
  "Well... I don't know!?",
  "Hyphenated-words and en–dash and em—dash.",
  "naïve café résumé coöperate façade",
  "Ünïcödé ÀÉÎÕÜ àéîõü ß ẞ",
  "Grüße aus München! Ça va? ¿Qué tal? ¡Hola!",
  "Dear Sir or Madam,\n\nI am writing to you regarding my order #12345.\n\nKind regards,\nJohn",
  "Once upon a time, in a land far, far away, there lived a king who had three daughters.",
  "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer",
  "pneumonoultramicroscopicsilicovolcanoconiosis",
  "Supercalifragilisticexpialidocious antidisestablishmentarianism",
  "A",
  "a",
  "I",
  "ab",
  "The end.",
  "word",
  " word",
  "  word",
  "\tword",
  "\nword",
  "word\n",
  "word \n",
  "word  \n  next",
];

const code = [
  "func main() {\n\tfmt.Println(\"hello\")\n}\n",
  "package tokenize\n\nimport (\n\t\"errors\"\n\t\"fmt\"\n)\n",
  "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
  "class Foo(Bar):\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self, x: int = 0) -> None:\n        self._x = x\n",
  "for (let i = 0; i < arr.length; i++) { console.log(`${i}: ${arr[i]}`); }",
  "const f = async (a, b) => { await sleep(100); return a ?? b; };",
  "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u32> = (0..10).collect();\n    Ok(())\n}",
  "#include <stdio.h>\nint main(int argc, char **argv) { printf(\"%d\\n\", argc); return 0; }",
  "SELECT id, name FROM users WHERE age >= 18 AND name LIKE 'A%' ORDER BY name DESC;",
  "{\"key\": \"value\", \"list\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
  "<html><head><title>Test</title></head><body><p class=\"x\">Hi &amp; bye</p></body></html>",
  "$ ls -la /usr/local/bin | grep -E '^d' && echo \"done\" > /dev/null 2>&1",
  "if [[ -z \"$VAR\" ]]; then\n  exit 1\nfi",
  "x = [i**2 for i in range(10) if i % 2 == 0]",
  "a+=1;b-=2;c*=3;d/=4;e%=5;f<<=6;g>>=7;h&=8;i|=9;j^=10",
  "!= == === !== <= >= => -> :: ... ?. ?? || && ++ --",
  "/^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\\.[a-zA-Z]{2,}$/",
  "    indented with four spaces\n        and eight\n\t\tand two tabs",
  "line one\r\nline two\r\n\r\nline four\r\n",
  "mixed\r\n\n\r\r\nendings",
  "// comment\n/* block\n   comment */\n# hash comment\n-- sql comment",
  "int x = 0x1F; float y = 3.14e-10f; long z = 1_000_000L;",
  "std::vector<std::pair<int, std::string>> v{{1, \"a\"}, {2, \"b\"}};",
  "@Override\npublic String toString() { return \"Foo{\" + \"x=\" + x + '}'; }",
  "<?php echo $_GET['name']; ?>",
  "\\begin{equation}\n  E = mc^2 \\quad \\int_0^\\infty e^{-x^2} dx = \\frac{\\sqrt{\\pi}}{2}\n\\end{equation}",
  "| col1 | col2 |\n|------|------|\n| a    | b    |",
  "# Title\n\n## Subtitle\n\n- item 1\n- item 2\n  - nested\n\n```go\nx := 1\n```\n",
  "https://example.com/path/to/page?query=1&other=two#fragment",
  "user.name+tag@example.co.uk",
  "C:\\Users\\Admin\\Documents\\file.txt",
  "key1=value1;key2=value2;key3=value3",
  "snake_case_name camelCaseName PascalCaseName SCREAMING_SNAKE kebab-case-name",
  "__init__ __main__ _private __dunder__",
  "0xDEADBEEF 0b1010 0o777 1e9 .5 5. -0.0",
  "a_b_c_d_e_f_g_h_i_j_k_l_m_n_o_p",
  "print('it''s')",
  "x[0][1][2] = y{a}{b} <T, U> (p)(q)",
];

const cjk = [
  "你好，世界！",
  "我爱北京天安门。",
  "人工智能正在改变世界，大型语言模型是其中的重要组成部分。",
  "这是一个测试：包括标点符号、数字123和English混合。",
  "こんにちは世界",
  "今日はいい天気ですね。カタカナとひらがなと漢字。",
  "アイウエオ　カキクケコ",
  "ｶﾀｶﾅ ﾊﾝｶｸ",
  "안녕하세요 세계",
  "한국어 텍스트와 English 그리고 123",
  "全角ＡＢＣ１２３！？",
  "「引用」『二重』【括弧】〈山〉《書名》",
  "中文 空格  两个   三个",
  "〇一二三四五六七八九十百千万亿",
  "龍龜鬱齉",
  "𠀀𠀁𪚥 (CJK Extension B)",
  "日本語の文章です。\n次の行です。",
  "繁體中文與简体中文",
  "ㄅㄆㄇㄈ 注音符號",
  "한글 자모 ㄱㄴㄷ ㅏㅑㅓ",
];

const scripts = [
  "Привет, мир! Как дела?",
  "Γειά σου Κόσμε! αβγδε ΑΒΓΔΕ",
  "مرحبا بالعالم! كيف حالك؟",
  "שלום עולם! מה שלומך?",
  "नमस्ते दुनिया! आप कैसे हैं?",
  "हिन्दी में लिखा गया पाठ।",
  "สวัสดีชาวโลก ภาษาไทย",
  "Xin chào thế giới! Tiếng Việt có dấu.",
  "გამარჯობა მსოფლიო",
  "Բարեւ աշխարհ",
  "ሰላም ልዑል",
  "வணக்கம் உலகம்",
  "ওহে বিশ্ব",
  "សួស្តីពិភពលោក",
  "ᠮᠣᠩᠭᠣᠯ",
  "Türkçe ğüşıöç İstanbul",
  "Polski: zażółć gęślą jaźń",
  "Čeština: příliš žluťoučký kůň",
  "Íslenska: Þetta er próf ð æ",
  "Esperanto: ĉiuĵaŭde ŝŭ",
  "ʻOkina ʻŌlelo Hawaiʻi",
  "ℵ₀ ∀x∈ℝ: x² ≥ 0 ∑ ∏ ∫ √ ∞ ≠ ≈ ±",
  "© ® ™ § ¶ † ‡ • … ‰ ′ ″",
  "€100 £50 ¥1000 ₹500 ₿0.5 $20 ¢",
  "← → ↑ ↓ ↔ ⇒ ⇔ ★ ☆ ♠ ♥ ♦ ♣",
  "Ⅰ Ⅱ Ⅲ Ⅻ ⅰ ⅱ ⅲ",
  "𝕳𝖊𝖑𝖑𝖔 𝓦𝓸𝓻𝓵𝓭 𝟙𝟚𝟛",
  "ᚠᚢᚦᚨᚱᚲ runes",
  "𓀀𓀁 hieroglyphs",
  "Ꭰ Ꭱ Ꭲ Cherokee",
];

const emoji = [
  "😀",
  "😀😃😄😁",
  "I ❤️ NY",
  "👍🏻 👍🏼 👍🏽 👍🏾 👍🏿",
  "👨‍👩‍👧‍👦 family",
  "🏳️‍🌈 🏴‍☠️",
  "🇺🇸 🇬🇧 🇯🇵 🇩🇪",
  "1️⃣ 2️⃣ #️⃣ *️⃣",
  "🧑‍💻 coding at 3am ☕",
  "emoji at end 🎉",
  "🎉 emoji at start",
  "mixed😀text😃without🎉spaces",
  "🔥🔥🔥🔥🔥🔥🔥🔥🔥🔥",
  "⭐✨🌟💫",
  "☺ ☹ ☠ ✌ ✍",
  "🤖 LLM says: \"Hello!\" 👋",
];

const whitespace = [
  "",
  " ",
  "  ",
  "   ",
  "\t",
  "\n",
  "\r",
  "\r\n",
  "\n\n",
  "\n\n\n",
  " \n",
  "\n ",
  " \n ",
  "\t\n\t",
  "a\n\nb",
  "a \n \n b",
  "a\t\tb",
  "a\u00a0b",
  "a\u00a0\u00a0b",
  "\u00a0word",
  "a\u3000b",
  "a\u2028b",
  "a\u2029b",
  "a\u0085b",
  "a\u000bb\u000cc",
  "a\u2003b\u2009c\u200ad",
  "a\u200bb",
  "a\u202fb\u205fc",
  "a\u1680b",
  " ".repeat(17),
  " ".repeat(64) + "x",
  "\t".repeat(9) + "x",
  "\n".repeat(12) + "x",
  "x" + " ".repeat(33),
  "x" + "\n".repeat(7) + " ".repeat(5) + "y",
  "  \n\n  \n  x  \n",
  "end with newline\n",
  "end with spaces and newline   \n",
  "\r\n\r\n\r\n",
  "a \r\n b",
  "tab\tseparated\tvalues\there",
  "space before punctuation , . ! ?",
  " ! ? .",
  "   !!!   ???   ...   ",
  "a  !b",
  "a\n!b",
  "a \t!b",
];

const numbers = [
  "0",
  "7",
  "42",
  "123",
  "1234",
  "12345",
  "123456",
  "1234567",
  "12345678901234567890",
  "3.14159265358979",
  "-273.15",
  "+1 (555) 123-4567",
  "1,234,567.89",
  "1.234.567,89",
  "6.022e23",
  "2024-01-15T10:30:00Z",
  "15/01/2024 10:30",
  "v1.2.3-beta.4+build.5",
  "192.168.1.1:8080",
  "00001",
  "1st 2nd 3rd 4th 21st 100th",
  "100% 50‰ 3/4 ½ ¾ ⅓",
  "x1 y22 z333 w4444",
  "abc123def456",
  "123abc456def",
  "١٢٣٤٥ ٦٧٨٩٠",
  "०१२३४५६७८९",
  "１２３４５",
  "¹²³ ₁₂₃ ⁴⁵⁶",
  "①②③ ⑴⑵⑶",
  "Ⅳ Ⅸ ⅩⅬ",
  "3 apples and 12 oranges cost $4.50",
  "Call 911 or 112.",
  "PI = 3.14159 2653589793 23846",
  "9".repeat(40),
  "1 2 3 4 5 6 7 8 9 10",
  "0.0001 0.001 0.01 0.1",
  "1e-5 1E+10 -1e3",
  "𝟘𝟙𝟚𝟛 𝟎𝟏𝟐",
  "๑๒๓ Thai digits",
];

const special = [
  "<|endoftext|>",
  "<|im_start|>",
  "<|im_end|>",
  "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
  "<|im_start|>system\nYou are a helpful assistant.<|im_end|>",
  "<|im_end|><|im_start|>",
  "<|im_start|><|im_start|><|im_start|>",
  "<<|im_start|>>",
  "<|im_start|",
  "|im_start|>",
  "<|im_start |>",
  "<|IM_START|>",
  "text<|endoftext|>more text",
  "<think>\nreasoning\n</think>\n\nanswer",
  "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
  "<tool_response>\nresult\n</tool_response>",
  "<|fim_prefix|>def f():<|fim_suffix|>\n    return 1<|fim_middle|>",
  "<|vision_start|><|image_pad|><|vision_end|>",
  "<|object_ref_start|>the cat<|object_ref_end|><|box_start|>(1,2),(3,4)<|box_end|>",
  "<|begin_of_text|>",
  "<|end_of_text|>",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
  "<|start_header_id|>assistant<|end_header_id|>\n\n",
  "<|eot_id|><|eom_id|><|python_tag|>",
  "<|reserved_special_token_0|><|reserved_special_token_250|>",
  "<|reserved_special_token_251|>",
  "<|finetune_right_pad_id|>",
  "before <|eot_id|> after",
  " <|eot_id|> ",
  "\n<|im_end|>\n",
  "<|im_end|>\u0301",
  "e<|im_end|>\u0301x",
  "a<think>b</think>c",
  "<|repo_name|>kvindex<|file_sep|>main.go",
  "<|quad_start|><|quad_end|><|video_pad|>",
  "<s></s><unk><pad>[CLS][SEP][MASK]",
  "<|im_start|>user\n<|im_start|>nested?<|im_end|><|im_end|>",
  "<|im_start|>\u00a0<|im_end|>",
];

const nfd = [
  "e\u0301",
  "Cafe\u0301 na\u0308ive re\u0301sume\u0301",
  "A\u030a \u212b \u00c5",
  "\u2126 \u03a9",
  "\u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af",
  "a\u0323\u0302 a\u0302\u0323",
  "Vie\u0323\u0302t Nam Tie\u0301\u0302ng",
  "o\u0308\u0304 u\u0308\u0301",
  "\u0041\u030a\u0301",
  "\ufb01 \ufb02 \u2460 \u00bd",
  "e\u0301e\u0301e\u0301e\u0301",
  "\u0301 starts with a combining mark",
  "x\u0300\u0301\u0302\u0303\u0304\u0305\u0306\u0307",
  "\u05d1\u05bc \u05e9\u05c1",
  "\u0915\u093c \u0958",
  "\u00e9 vs e\u0301 vs \u0065\u0301",
  "\u1e9b\u0323",
  "\u0344 \u0340\u0341",
  "\u2000\u2001",
  "\uf900\uf901 CJK compatibility",
  "\u0958\u0959\u095a",
  "\u30ab\u3099 \u30cf\u309a \u304b\u3099",
  "\u1e0a\u0323 \u1e0c\u0307",
  "\u0061\u0328\u0301",
];

const odd = [
  "\u0000",
  "a\u0000b",
  "\u0001\u0002\u0003",
  "\u007f",
  "\u0080\u0081\u009f",
  "\ufeffBOM at start",
  "zero\u200bwidth\u200cnon\u200djoiner",
  "soft\u00adhyphen",
  "\ue000\ue001 private use",
  "\uf8ff",
  "\ufffd replacement",
  "\uffff\ufffe noncharacters",
  "\u{10ffff}",
  "\u{1f600}\u{fe0f}",
  "\u0378\u0379 unassigned",
  "a\ufe0fb\ufe0e",
  "\u{e0041}\u{e0042} tags",
  "\u061c\u200e\u200f\u202a\u202e bidi",
  "\u{1d400}\u{1d401}",
  "\u3164\u115f fillers",
  "~`!@#$%^&*()_+-={}[]|\\:;\"'<>,.?/",
  "...",
  "---",
  "***",
  "!!!",
  "???",
  "!?!?",
  "((()))",
  "[[[]]]",
  "{{{}}}",
  "\"\"\"",
  "'''",
  "```",
  "<<>>",
  "@@",
  "##",
  "$$$",
  "%%",
  "^^",
  "&&",
  "||",
  "\\\\",
  "//",
  "==",
  "__",
  "--",
  "++",
  "»«„“”‘’‹›",
  "。、！？：；",
  "·•◦‣",
];

// Deterministic pseudo-random strings over a mixed alphabet (xorshift32, fixed seed).
function randomStrings(count) {
  let s = 0x9e3779b9;
  const next = () => {
    s ^= s << 13; s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5; s >>>= 0;
    return s;
  };
  const pools = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    " \t\n\r\u00a0\u3000",
    ".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`",
    "你好世界中文字符测试人工智能日本語カタカナひらがな한국어",
    "àéîõüçñßøåæœ",
    "😀🎉👍🏽❤️🇯🇵👨‍👩‍👧",
    "\u0301\u0308\u0323\u030a",
    "абвгдежзийклмнопрстуфхцчшщъыьэюя",
    "αβγδεζηθικλμνξοπρστυφχψω",
    "٠١٢٣٤٥٦٧٨٩١٢",
    "<|im_start|>|<|im_end|>|<|eot_id|>|<think>",
  ];
  const out = [];
  for (let i = 0; i < count; i++) {
    const len = 1 + (next() % 60);
    let str = "";
    for (let j = 0; j < len; j++) {
      const pool = pools[next() % pools.length];
      if (pool.includes("|") && pool.startsWith("<")) {
        const parts = pool.split("|>|");
        str += parts[next() % parts.length] + (next() % 2 ? "|>" : "");
        continue;
      }
      const chars = Array.from(pool);
      str += chars[next() % chars.length];
    }
    out.push(str);
  }
  return out;
}

// About 20,000 characters of English prose with paragraphs, numbers and punctuation.
function longEnglish() {
  const paragraphs = [
    "Large language models turn text into tokens before they do anything else. A tokenizer splits the input into pieces, maps every piece to an integer, and hands the integers to the model. The same text must always produce the same integers, or caches keyed by token prefixes stop matching.",
    "In 2023, the serving stack of a typical deployment handled 1,200 requests per second across 16 GPUs. Each request carried, on average, 2,345 prompt tokens and produced 187 completion tokens; about 70% of the prompt tokens were shared with an earlier request.",
    "Prefix caching works because chat conversations grow by appending: the system prompt, the earlier turns, and the tool definitions repeat verbatim. When the router knows which worker already holds those blocks, it can send the request there and skip most of the prefill.",
    "\"Why not hash the text directly?\" you might ask. Because the engine's cache is keyed by token blocks, and two different strings can share a token prefix while their byte prefixes differ (or the other way round). Only the exact token ids line up with the engine's blocks.",
    "The byte-level BPE algorithm starts from single bytes and repeatedly merges the adjacent pair with the lowest rank. Ranks come from the order of the merges list: the earlier a merge appears, the sooner it applies. Words that occur often end up as a single token; rare words stay split.",
    "Whitespace matters. Two spaces are not one space, a tab is not four spaces, and a trailing newline changes the last token. Code in particular is full of indentation:\n\n    for item in items:\n        process(item)\n\nand every level of it must be tokenized exactly as the engine does.",
    "Numbers are split differently by different models: some keep digits one by one, others group up to three digits together. 1234567 might become 1|2|3|4|5|6|7 or 123|456|7, and a cache lookup that gets this wrong misses every block after the first number.",
    "Finally, special tokens such as the ones that open and close a chat turn are matched before anything else, so that a literal marker in the text becomes one token and not a dozen pieces of punctuation.",
  ];
  let text = "";
  let i = 0;
  while (text.length < 20000) {
    text += paragraphs[i % paragraphs.length] + (i % 3 === 2 ? "\n\n" : "\n");
    i++;
  }
  return text.slice(0, 20000);
}

function longMixed() {
  const parts = [
    "def handler(req):\n    return {\"ok\": True, \"n\": 42}\n",
    "人工智能与机器学习。",
    "Ünïcödé café naïve — ",
    "😀👍🏽 ",
    "    \t  \n",
    "x=1;y=2;z=x+y*3.14159\n",
    "<|im_start|>user\nhi<|im_end|>\n",
    "Привет мир ",
    "١٢٣ 4567 89 ",
  ];
  let text = "";
  let i = 0;
  while (text.length < 8000) {
    text += parts[(i * 7) % parts.length];
    i++;
  }
  return text;
}

const long = [
  longEnglish(),
  longMixed(),
  "a".repeat(3000),
  "ab".repeat(1500),
  " ".repeat(2500),
  "\n".repeat(600),
  "1234567890".repeat(100),
  "😀".repeat(300),
  "你".repeat(1000),
  "!".repeat(700),
  "é".repeat(500),
  "e\u0301".repeat(400),
];

// corpus returns every string once (a random string may repeat a written one).
function corpus() {
  const all = [].concat(prose, code, cjk, scripts, emoji, whitespace, numbers, special, nfd, odd, long, randomStrings(120));
  return Array.from(new Set(all));
}

module.exports = { corpus };
