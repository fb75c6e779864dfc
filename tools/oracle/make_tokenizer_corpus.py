#!/usr/bin/env python3
"""Writes tests/data/tokenizer/corpus.jsonl: the tokenizer conformance corpus (one JSON string per line).

Pure standard library, fixed seed: re-running it reproduces the committed file byte for byte.
Hand-written lines cover prose in many scripts, code, numbers, whitespace and special-token strings; generated lines
mix those pieces with random Unicode from chosen blocks, emoji sequences and whitespace runs.
Usage: python3 tools/oracle/make_tokenizer_corpus.py [OUT]
"""
import json
import random
import sys

HAND = [
    # English prose, punctuation, contractions
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
    "Don't you think we'll need more? I'd say they've done it; you're right, aren't you?",
    "Mr. O'Neil's café—open 24/7—serves crème brûlée & jalapeño-infused Ünïcödé \"soups\" (really!).",
    "Hello, world!!! What?!... Wait... OK.",
    "  leading spaces and trailing spaces   ",
    "e-mail: first.last+tag@example.co.uk, URL: https://example.com/path?q=1&r=two#frag",
    "ALL CAPS SENTENCE WITH NUMBERS 123 AND SYMBOLS $%^&*",
    "camelCaseIdentifier snake_case_identifier kebab-case-identifier SCREAMING_SNAKE",
    # Chinese
    "人工智能正在改变我们的生活方式，尤其是在医疗、教育和交通领域。",
    "今天天气很好，我们去公园散步吧！你觉得怎么样？",
    "《红楼梦》是中国古典四大名著之一，作者曹雪芹。",
    "深度求索（DeepSeek）发布了新的大语言模型V4，支持百万token上下文。",
    "他说：“这是2024年的第3季度报告，增长率为12.5%。”",
    "繁體中文：臺灣的夜市文化非常豐富，鹽酥雞和珍珠奶茶都很有名。",
    # Japanese
    "日本語のテキストです。ひらがな、カタカナ、漢字が混ざっています。",
    "東京タワーは1958年に完成しました。高さは333メートルです。",
    "ｶﾀｶﾅの半角文字とＡＢＣの全角英字、１２３の全角数字。",
    "「こんにちは」と彼女は言った。ラーメンを食べに行きましょう！",
    # Korean
    "안녕하세요, 만나서 반갑습니다. 오늘 날씨가 정말 좋네요.",
    "대한민국의 수도는 서울이며, 인구는 약 950만 명입니다.",
    # Arabic / Hebrew / Persian (RTL)
    "مرحبا بكم في عالم الذكاء الاصطناعي. هذا نص باللغة العربية.",
    "العدد ١٢٣٤٥ مكتوب بالأرقام الهندية، والعدد 12345 بالأرقام العربية.",
    "שלום עולם! זהו טקסט בעברית עם ניקוד: בְּרֵאשִׁית בָּרָא אֱלֹהִים.",
    "فارسی: زبان فارسی یکی از زبان‌های هندواروپایی است.",
    "Mixed RTL: the word \"שלום\" means peace, and \"سلام\" too.",
    # Cyrillic, Greek
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Україна, Беларусь, Србија, България — кириллические алфавиты.",
    "Γειά σου Κόσμε! Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
    # Indic, Thai, SE Asian
    "हिन्दी भारत की राजभाषा है। नमस्ते, आप कैसे हैं?",
    "বাংলা ভাষা বিশ্বের সপ্তম বৃহত্তম ভাষা।",
    "தமிழ் ஒரு பழமையான மொழி.",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ สวัสดีครับ",
    "Tiếng Việt có nhiều dấu: Hà Nội, Thành phố Hồ Chí Minh, phở bò.",
    "ქართული ენა — Georgian script; Հայերեն — Armenian script.",
    "አማርኛ የኢትዮጵያ ቋንቋ ነው።",
    # European with diacritics
    "Zażółć gęślą jaźń. Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Größenwahn, Straße, Fußgängerübergänge – Äpfel, Öl, Übermut.",
    "Ça va? Où est la bibliothèque? L'été dernier, j'ai visité Besançon.",
    "¿Dónde está el baño? ¡Qué día tan bonito! Año, niño, pingüino.",
    "Türkçe: İstanbul, ığdır, şeker, çiçek, öğrenci, ülke.",
    "Íslenska: Þetta er ðæmi. Føroyskt, Dansk: æøå ÆØÅ.",
    # Emoji
    "I love 🍕 and 🍣! 😀😃😄😁😆",
    "Family: 👨‍👩‍👧‍👦 couple: 👩‍❤️‍👨 technologist: 🧑🏽‍💻",
    "Skin tones: 👍🏻👍🏼👍🏽👍🏾👍🏿 wave 👋🏿 hands 🙌🏾",
    "Flags: 🇺🇸🇨🇳🇯🇵🇩🇪🇫🇷 🏳️‍🌈 🏴‍☠️ 🏴󠁧󠁢󠁳󠁣󠁴󠁿",
    "Keycaps 1️⃣2️⃣#️⃣ hearts ❤️🧡💛💚💙💜 text-style ☺︎ vs emoji ☺️",
    "Emoji-only: 🤖🤖🤖🤖🤖🤖🤖🤖",
    # Math, symbols, astral
    "∀x ∈ ℝ: x² ≥ 0, ∑_{i=1}^{n} i = n(n+1)/2, √2 ≈ 1.41421356, π ≠ 3, ∞ > ℵ₀.",
    "Currency: $100, €85.50, £70, ¥1000, ₹500, ₩10000, ₿0.001, ¢99",
    "Arrows → ← ↑ ↓ ⇒ ⇔, box ┌─┐│└┘, blocks █▓▒░, music ♩♪♫♬",
    "Math alphanumerics: 𝐀𝐁𝐂 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕏𝕐ℤ 𝒜ℬ𝒞, CJK ext-B: 𠀀𠀁𪚥",
    "Superscripts x¹²³ subscripts H₂O, fractions ½ ¼ ¾ ⅓, roman Ⅻ ⅻ",
    # Numbers
    "1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890",
    "3.14159265358979323846 -0.001 +42 1e10 6.022e23 0x1F 0b1010 0o777",
    "Dates: 2026-12-01, 12/01/2026, 01.12.2026; time 23:59:59.999 UTC+08:00",
    "Phone: +1 (555) 123-4567; IP 192.168.0.1; version v1.2.3-beta.4",
    "1,000,000 and 1.000.000 and 1 000 000 and 10^6",
    "Fullwidth １２３４５ Arabic-Indic ٠١٢٣٤٥٦٧٨٩ Devanagari ०१२३४५ Thai ๑๒๓",
    "Chinese numerals 一二三四五六七八九十百千万亿 and 第1234567号",
    # Code
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; return v.size() > 2 ? 0 : 1; }",
    "const add = (a, b) => a + b;\nconsole.log(`sum=${add(1, 2)}`);\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hello\")\n}\n",
    "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id WHERE o.total > 100 GROUP BY u.id;",
    "<!DOCTYPE html>\n<html><head><title>Test</title></head><body><div class=\"a\">Hi &amp; bye</div></body></html>",
    "{\"name\": \"dsv4\", \"version\": 4, \"tags\": [\"a\", \"b\"], \"nested\": {\"x\": null, \"y\": true}}",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\" | sed 's/a/b/g' >> out.log; done\n",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # list comprehension\r\nprint(x)\r\n",
    "if (a >= b && c <= d || !e) { return a->b.c[0]; } // comment /* block */",
    "    indented with four spaces\n\t\tand two tabs\n        eight spaces\n",
    "template <typename T>\nauto max(T a, T b) -> decltype(a > b ? a : b) { return a > b ? a : b; }",
    "regex: ^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}$",
    "LaTeX: \\frac{\\partial L}{\\partial \\theta} = \\sum_i \\nabla_\\theta \\log p(x_i)",
    "diff --git a/x.c b/x.c\n@@ -1,3 +1,4 @@\n-old line\n+new line\n context\n",
    "<<<>>> ;;; ::: ,,, ... !!! ??? ''' \"\"\" ``` ~~~ ### $$$ %%% ^^^ &&& *** ((( ))) [[[ ]]] {{{ }}} ||| \\\\\\",
    ">;\n>;\n\n);\r\n}\n\n\n",
    # Whitespace runs
    "a  b   c    d     e      f",
    "tab\tseparated\tvalues\t\t\there",
    "line1\nline2\n\nline4\n\n\n\nline8",
    "crlf\r\nline\r\n\r\nend\r",
    "   \n   \n\t\n \t \n",
    "          ",
    "\n\n\n\n",
    "\t\t\t\t",
    " \r\n \r\n ",
    "trailing newline\n",
    "ends with spaces    ",
    "\u00a0non\u00a0breaking\u00a0spaces\u2003em\u2003space\u3000ideographic\u3000space",
    "NEL\u0085line\u2028separator\u2029paragraph\u000bvertical\u000cformfeed",
    "mongolian\u180evowel \u180e sep\u180e\u180e end \u180e",
    "figure\u2007space narrow\u202fnbsp medium\u205fmath ogham\u1680space en\u2002em\u2003thin\u2009hair\u200a.",
    "info separators \u001c\u001d\u001e\u001f between\u001fwords and \u0085 NEL \u0085\u0085",
    "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom\u2060wj",
    "combining: e\u0301 a\u0300 o\u0308 n\u0303 — precomposed é à ö ñ; Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇",
    "control chars: \u0001\u0002\u0003\u001b[31mred\u001b[0m \u007f del",
    # Special-token strings inside text
    "<｜begin▁of▁sentence｜>Hello<｜end▁of▁sentence｜>",
    "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>",
    "Text with <think> inside and </think> then more.",
    "DSML: <｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
    "partial specials: <｜User <｜User｜ ｜DSML <thin </think <｜end▁of▁sentence",
    "adjacent<｜User｜><｜User｜><｜Assistant｜>x<｜latest_reminder｜>y<｜action｜>z",
    "<dsml:foo> and </dsml:bar> and <|EOT|> and <｜▁pad▁｜>",
    "nested <<think>> and <</think>> and <｜<｜User｜>｜>",
    "<｜place▁holder▁no▁17｜> <｜System｜> <|place_holder_mm_span_0100|>",
    # Misc
    "URL-ish: www.deepseek.com/v4?lang=zh-CN&x=%E4%BD%A0%E5%A5%BD",
    "Markdown: # Title\n\n- item **bold** _it_ `code`\n1. one\n> quote\n\n| a | b |\n|---|---|\n| 1 | 2 |\n",
    "C:\\Users\\name\\Documents\\file (1).txt and /usr/local/lib/python3.11/site-packages/",
    "SMILES: CC(=O)OC1=CC=CC=C1C(=O)O; base64: SGVsbG8sIFdvcmxkIQ==",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "ababababababababababababababababababab 111111111111111111111 ..............................",
    "ｈｅｌｌｏ　ｗｏｒｌｄ！（全角）",
    "Mixed中文English日本語한국어Русский123混合",
    "中文,English;日本語.한국어!Русский?",
    "我爱北京天安门abc123def你好世界ＸＹＺ",
    "龥龦 一丁 㐀㐁 ぁゟ゠ヿ ㇰ ｦ 〆 々",
    "Emoji in code: print(\"🚀 launch\")  # 🐍",
    "",
    " ",
    "a",
    "\n",
    "Ω",
    "🎉",
]

WORDS = {
    "en": "the of and to in is that it was for on are as with his they at be this from have or by one had not but what all were when we there can an your which their said if do will each about how up out them then she many some so these would other into has more her two like him see time could no make than first been its who now people my made over did down only way find use may water long little very after words called just where most know".split(),
    "zh": "我们 你们 他们 中国 世界 今天 明天 工作 学习 时间 问题 发展 经济 社会 文化 科学 技术 人民 国家 政府 历史 语言 计算机 模型 数据 训练 推理 网络".split(),
    "ja": "わたし あなた 日本 東京 コンピュータ プログラム データ です ます した ません こと もの ところ ありがとう".split(),
    "ko": "한국 서울 사람 시간 컴퓨터 프로그램 데이터 입니다 합니다 그리고 하지만".split(),
    "ru": "и в не на я быть он с что а по это она этот к но они мы как из у который то за свой".split(),
    "ar": "في من على إلى أن هذا هذه التي الذي كان قد لا ما مع عن كل بين".split(),
    "hi": "और का की के में है यह से को पर एक हैं था".split(),
    "code": "def class return if else elif for while import from self None True False int main void const auto std:: -> => != == <= >= && || ++ -- += {} [] () ; : , . \" ' ` # // /* */".split(),
}
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧", "🇯🇵", "❤️", "🧑🏿‍🚀", "✨", "🔥", "🙏🏻", "👩🏾‍🔬", "🏳️‍⚧️", "🐈‍⬛", "1️⃣"]
SPECIAL = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜", "<｜end▁of▁sentence｜>",
           "<｜begin▁of▁sentence｜>", "<｜latest_reminder｜>", "<｜action｜>", "<dsml:", "</dsml:"]
WS = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n", "\t\t", "\u00a0", "\u3000", "    ", "\u180e", "\u2009",
      "\u0085", "\u000b", "\r"]
PUNCT = list(".,;:!?-—…()[]{}<>\"'`~@#$%^&*_+=|\\/") + ["。", "，", "、", "！", "？", "「", "」", "《", "》", "：", "；"]
BLOCKS = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF),
          (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x2190, 0x22FF), (0x3000, 0x30FF),
          (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF), (0x1F300, 0x1F6FF), (0x1F900, 0x1F9FF),
          (0x1D400, 0x1D7FF), (0x20000, 0x2A6DF), (0x0300, 0x036F)]


def rand_chars(rng, n):
    lo, hi = rng.choice(BLOCKS)
    out = []
    for _ in range(n):
        cp = rng.randint(lo, hi)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        out.append(chr(cp))
    return "".join(out)


def number(rng):
    k = rng.randint(0, 5)
    if k == 0:
        return str(rng.randint(0, 10 ** rng.randint(1, 12)))
    if k == 1:
        return f"{rng.uniform(-1000, 1000):.{rng.randint(1, 6)}f}"
    if k == 2:
        return f"{rng.randint(1, 9999):,}"
    if k == 3:
        return "".join(chr(0xFF10 + int(d)) for d in str(rng.randint(0, 99999)))
    if k == 4:
        return "".join(chr(0x660 + int(d)) for d in str(rng.randint(0, 99999)))
    return f"v{rng.randint(0, 9)}.{rng.randint(0, 99)}.{rng.randint(0, 999)}"


def generated(rng):
    parts = []
    for _ in range(rng.randint(1, 24)):
        r = rng.random()
        if r < 0.45:
            lang = rng.choice(list(WORDS))
            w = rng.choice(WORDS[lang])
            if lang == "en" and rng.random() < 0.2:
                w = w.capitalize() if rng.random() < 0.7 else w.upper()
            parts.append(w)
        elif r < 0.55:
            parts.append(number(rng))
        elif r < 0.65:
            parts.append(rng.choice(PUNCT) * rng.randint(1, 3))
        elif r < 0.72:
            parts.append(rng.choice(EMOJI) * rng.randint(1, 2))
        elif r < 0.80:
            parts.append(rand_chars(rng, rng.randint(1, 8)))
        elif r < 0.84:
            parts.append(rng.choice(SPECIAL))
        else:
            parts.append(rng.choice(WS) * rng.randint(1, 3))
        # Separator: usually a space, sometimes nothing or other whitespace.
        s = rng.random()
        parts.append(" " if s < 0.6 else ("" if s < 0.85 else rng.choice(WS)))
    return "".join(parts)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/tokenizer/corpus.jsonl"
    rng = random.Random(20261201)
    lines = list(HAND)
    # Pairwise concatenations of hand-written lines (script changes at boundaries).
    for _ in range(300):
        a, b = rng.choice(HAND), rng.choice(HAND)
        lines.append(a + rng.choice(["", " ", "\n", "\t"]) + b)
    while len(lines) < 2400:
        lines.append(generated(rng))
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        for s in lines:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
    print(f"{out}: {len(lines)} lines")


if __name__ == "__main__":
    main()
