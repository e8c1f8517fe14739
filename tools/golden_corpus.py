"""Texts for gen_goldens.py: the BPE training corpus and the golden test cases.

All text is written here or generated from a seeded random.Random, so the
corpus (and so the trained tokenizer) is the same on every machine.
"""

import random

SEED_TEXTS = [
    # English prose
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
    "It was the best of times, it was the worst of times; it was the age of wisdom.",
    "Serving systems batch requests together so that the accelerator stays busy, "
    "while each user still sees the first token quickly.",
    "I'm sure you'll agree: we've done what we'd planned, and they're happy. Don't worry!",
    "WE'RE LOUD. I'M HERE. YOU'LL SEE. IT'S FINE. THEY'VE GONE. HE'D KNOW.",
    "Dr. Smith's report (pp. 12-15) says 3.5% of 1,024 samples failed on 2024-06-07.",
    "Email me at someone@example.com or visit https://example.org/path?q=1&x=y#frag.",
    # code
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "#include <vector>\nstd::vector<float> v(128, 0.0f);\nauto it = v.begin();\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;\n",
    '{"key": "value", "list": [1, 2, 3], "nested": {"a": null, "b": true}}\n',
    "if __name__ == \"__main__\":\n    main()\n",
    "x = [i ** 2 for i in range(10) if i % 2 == 0]  # squares of evens\n",
    "    \t  \n\n\n    indented    text   with    runs     of      spaces\r\n",
    # CJK and other scripts
    "你好，世界！今天天气很好，我们去公园散步吧。机器学习和人工智能正在改变世界。",
    "北京是中国的首都。上海是一个国际化的大都市。深度学习模型需要大量的数据。",
    "日本語のテキストです。東京は日本の首都です。ひらがなとカタカナ、そして漢字。",
    "한국어 문장입니다. 서울은 대한민국의 수도입니다. 안녕하세요, 만나서 반갑습니다.",
    "مرحبا بالعالم. اللغة العربية تكتب من اليمين إلى اليسار.",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Γειά σου κόσμε. Ελληνικά γράμματα: αβγδε.",
    "नमस्ते दुनिया। यह हिंदी में एक वाक्य है।",
    "Café, naïve, résumé, coöperate, façade, jalapeño, Ångström, Straße.",
    # emoji
    "I ❤️ pizza 🍕 and 🍣! 😀😃😄😁 👍🏽 👨‍👩‍👧‍👦 🇺🇸 🇯🇵 🇫🇷 🏳️‍🌈 ✨🚀",
    # numbers
    "0 1 2 3 4 5 6 7 8 9 10 42 100 256 1000 1024 65536 3.14159 2.71828 -17 +3e-5",
]

_WORDS = (
    "the of and to in is that it for was on are as with his they at be this from have "
    "or by one had not but what all were when we there can an your which their said if "
    "do will each about how up out them then she many some so these would other into has "
    "more her two like him see time could no make than first been its who now people my "
    "made over did down only way find use may water long little very after words called "
    "just where most know get through back much before go good new write our used me man "
    "too any day same right look think also around another came come work three word must "
    "because does part even place well such here take why things help put years different "
    "away again off went old number great tell men say small every found still between name "
    "should home big give air line set own under read last never us left end along while "
    "might next sound below saw something thought both few those always looked show large "
    "often together asked house world going want school important until form food keep "
    "children feet land side without boy once animals life enough took sometimes four head "
    "above kind began almost live page got earth need far hand high year mother light parts "
    "country father let night following picture being study second eyes soon times story "
    "boys since white days paper hard near sentence better best across during today others "
    "however sure means knew its try told young miles sun ways thing whole hear example "
    "heard several change answer room sea against top turned learn point city play toward "
    "five using himself usually model token tensor kernel cache memory request server batch "
    "latency throughput encoder decoder attention vision image pixel patch embedding layer"
).split()

_IDENTS = ("x y i j k n idx count total buffer size len data result value key node "
           "self other tmp out input output weight bias hidden state config args").split()
_CJK = ("的一是不了在人有我他这个们中来上大为和国地到以说时要就出会可也你对生能而子那得于着"
        "下自之年过发后作里用道行所然家种事成方多经么去法学如都同现当没动面起看定天分还进好小"
        "部其些主样理心她本前开但因只从想实日军者意无力它与长把机十民第公此已工使情明性知全三"
        "又关点正业外将两高间由问很最重并物手应战向头文体政美相见被利什二等产或新己制身果加西斯"
        "月话合回特代内信表化老给世位次度门任常先海通教儿原东声提立及比员解水名真论处走义各入几"
        "口认条平系气题活尔更别打女变四神总何电数安少报才结反受目太量再感建务做接必场件计管期市"
        "直德资命山金指克许统区保至队形社便空决治展马科司五基眼书非则听白却界达光放强即像难且权"
        "思王象完设式色路记南品住告类求据程北边死张该交规万取拉格望觉术领共确传师观清今切院让识"
        "候带导争运笑飞风步改收根干造言联持组每济车亲极林服快办议往元英士证近失转夫令准布始怎呢")
_KANA = "".join(chr(c) for c in range(0x3041, 0x3094)) + "".join(chr(c) for c in range(0x30A1, 0x30F5))
_EMOJI = ["😀", "😂", "🥲", "😍", "🤔", "👍", "👍🏻", "👍🏿", "🎉", "🔥", "💯", "🚀", "🌍", "🍕",
          "❤️", "✅", "⚠️", "👨‍💻", "👩‍🔬", "👨‍👩‍👧", "🇨🇳", "🇩🇪", "🇧🇷", "🏳️‍🌈", "🐍", "🦀"]


def _sentence(rng):
    n = rng.randint(4, 16)
    words = [rng.choice(_WORDS) for _ in range(n)]
    if rng.random() < 0.3:
        words[0] = words[0].capitalize()
    if rng.random() < 0.1:
        words = [w.upper() for w in words]
    if rng.random() < 0.2:
        words.insert(rng.randint(0, len(words)), str(rng.randint(0, 99999)))
    if rng.random() < 0.15:
        words.insert(rng.randint(0, len(words)), rng.choice(["don't", "it's", "we'll", "I'm",
                                                             "they've", "she'd", "YOU'RE"]))
    return " ".join(words) + rng.choice([".", ".", "!", "?", ",", ":", ";", ""])


def _code(rng):
    a, b, c = (rng.choice(_IDENTS) for _ in range(3))
    ind = rng.choice(["    ", "  ", "\t", "        "])
    templates = [
        f"def {a}_{b}({c}):\n{ind}return {c} + {rng.randint(0, 999)}\n",
        f"for {a} in range(len({b})):\n{ind}{c}[{a}] = {b}[{a}] * 2\n",
        f"{a} = {{'{b}': {rng.randint(0, 99)}, '{c}': [{rng.randint(0, 9)}, {rng.randint(0, 9)}]}}\n",
        f"int {a}_{b}(const std::vector<int>& {c}) {{\n{ind}return {c}.size();\n}}\n",
        f"if ({a} != nullptr && {b}->{c} >= {rng.randint(0, 64)}) {{ {a}++; }}\n",
        f"// TODO({a}): handle {b} when {c} is empty\n",
        f"let {a}: Vec<u32> = {b}.iter().map(|{c}| {c} * 2).collect();\n",
    ]
    return rng.choice(templates)


def _cjk(rng):
    return "".join(rng.choice(_CJK) for _ in range(rng.randint(3, 20))) + rng.choice(["。", "，", "！", "？", ""])


def _kana(rng):
    return "".join(rng.choice(_KANA) for _ in range(rng.randint(3, 12))) + "。"


def _hangul(rng):
    words = ["".join(chr(0xAC00 + rng.randint(0, 2000)) for _ in range(rng.randint(1, 4)))
             for _ in range(rng.randint(2, 6))]
    return " ".join(words) + "."


def _misc(rng):
    k = rng.randint(0, 4)
    if k == 0:
        return " ".join(rng.choice(_EMOJI) for _ in range(rng.randint(1, 5)))
    if k == 1:
        return f"{rng.randint(0, 10**9)} {rng.random():.6f} {rng.randint(-500, 500)}"
    if k == 2:
        return " " * rng.randint(1, 12) + rng.choice(_WORDS) + "\t" * rng.randint(0, 3) + "\n" * rng.randint(0, 3)
    if k == 3:
        return rng.choice(["\r\n", "\n\n", "   \n", "\t\t"]) + rng.choice(_WORDS)
    return rng.choice(SEED_TEXTS)


def training_corpus(seed):
    """Yields the BPE training lines (about 1 MB of text)."""
    rng = random.Random(seed)
    for t in SEED_TEXTS:
        for _ in range(20):
            yield t
    gens = [_sentence] * 6 + [_code] * 3 + [_cjk] * 2 + [_kana, _hangul, _misc]
    for _ in range(12000):
        yield " ".join(rng.choice(gens)(rng) for _ in range(rng.randint(1, 4)))


def tokenizer_cases():
    """About 200 strings covering the tokenizer's hard corners."""
    cases = [
        "", " ", "  ", "\n", "\t", "\r\n", "a", "A", "hello", " hello", "hello ", "  hello  ",
        "Hello, world!", "hello world", "HELLO WORLD", "Hello\nWorld", "hello\n\nworld",
        "The quick brown fox jumps over the lazy dog.",
        # contractions (the regex is case-insensitive for them)
        "don't", "Don't", "DON'T", "I'm", "I'M", "i'M", "you're", "YOU'RE", "we've", "WE'VE",
        "she'll", "SHE'LL", "he'd", "HE'D", "it's", "IT'S", "can't", "won't", "'s", "'tis",
        "rock'n'roll", "O'Neil's", "students' books", "it’s (curly apostrophe)",
        # numbers: every digit is its own pre-token
        "0", "7", "12345", "3.14159", "-42", "+1e-10", "1,000,000", "2024-06-07", "0x1F",
        "v1.2.3", "100%", "$19.99", "1st 2nd 3rd 4th", "٣٤٥ Arabic-Indic digits", "１２３ full-width",
        # whitespace
        "a  b", "a   b", "a    b", "a\tb", "a\t\tb", "a \tb", "a\t b", "a\nb", "a\r\nb", "a\rb",
        "a \n b", "a\n\n\nb", "   leading", "trailing   ", "\n\nleading newlines",
        "trailing newlines\n\n", " " * 40, "x" + " " * 33 + "y", "\t" * 9, "\n" * 7,
        " \n \n \n ", "\r\n\r\n", "line1\r\nline2\r\n", "tab\there\tand\tthere",
        "\u00a0non-breaking\u00a0space", "em\u2003space", "zero\u200bwidth", "\u3000ideographic space",
        # code
        "def f(x):\n    return x * 2\n", "int main() { return 0; }",
        "for (auto& v : vec) {\n\tv += 1;\n}", "if x != y && z >= 0 || !w:",
        "a->b.c::d", "x**2 + y**2 == r**2", "#include <stdio.h>", "// comment\n/* block */",
        "print(\"hello\")", "s = 'single' + \"double\"", "arr[i][j] = 0;", "lambda x: x+1",
        "{\"a\": [1, 2, {\"b\": null}]}", "<div class=\"x\">text</div>", "SELECT * FROM t;",
        "$HOME/bin:/usr/bin", "C:\\Windows\\System32", "https://example.com/a?b=c&d=e",
        "user@example.com", "@mention #hashtag", "~!@#$%^&*()_+`-=[]{}|;:,./<>?",
        "...", "!!!", "???", "---", "___", "***", "==>", "<=>", "!=", "-->",
        # CJK, Japanese, Korean
        "你好", "你好，世界！", "我爱机器学习。", "北京上海广州深圳", "中文English混合text",
        "这是一个很长的中文句子，用来测试分词器对中文字符的处理是否正确。",
        "こんにちは", "日本語のテキスト", "カタカナ", "ひらがな", "東京タワー", "ｶﾀｶﾅ half-width",
        "안녕하세요", "한국어 텍스트", "서울특별시", "ㄱㄴㄷ jamo",
        # other scripts
        "مرحبا بالعالم", "שלום עולם", "Привет мир", "Γειά σου", "नमस्ते", "สวัสดี", "Xin chào",
        # emoji
        "😀", "😀😀😀", "👍🏽", "❤️", "👨‍👩‍👧‍👦", "👩‍💻", "🏳️‍🌈", "🇺🇸", "🇯🇵🇫🇷", "🇺🇸🇺",
        "I ❤️ NY", "🚀 launch", "emoji😀inside", "✨✨ sparkle ✨✨", "🦀🐍☕",
        "#️⃣ keycap", "©®™", "♠♥♦♣", "→←↑↓", "∑∫√∞≈≠", "°C ±5",
        # combining characters, NFC vs NFD
        "caf\u00e9", "cafe\u0301", "e\u0301", "\u00c5ngstr\u00f6m", "A\u030angstro\u0308m",
        "\u212b", "\u1e9b\u0323", "n\u0303", "\u0041\u0308\u0304", "\uac00", "\u1100\u1161",
        "\u1100\u1161\u11a8", "\u0915\u094d\u0937", "\u00bd", "\ufb01 ligature", "\u2126 ohm",
        "z\u0335\u0321a\u0336\u0322l\u0337g\u0338o\u0334",
        # special tokens embedded in text
        "<|im_start|>user\nhi<|im_end|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
        "text<|endoftext|>more", "<|im_start|>assistant\n", " <|im_end|> ",
        "<|vision_start|><|image_pad|><|vision_end|>", "<|vision_start|><|image_pad|><|image_pad|><|vision_end|>",
        "a<|image_pad|>b", "<|video_pad|>", "<|box_start|>(10,20),(30,40)<|box_end|>",
        "<|object_ref_start|>the cat<|object_ref_end|>", "<|quad_start|>q<|quad_end|>",
        "<|vision_pad|>", "<|im_start|><|im_start|>", "<|im_end|>\n<|im_start|>",
        # near-special fragments that must NOT become special tokens
        "<|im_start", "im_start|>", "<|IM_START|>", "< |im_start| >", "<|unknown|>", "<||>",
        "<|im_start |>", "<<|im_end|>>", "|<|im_end|>|",
        # odd fragments
        "\u0000", "\u0001\u0002", "\x7f", "\ufeffBOM", "\ufffd replacement", "\ud7ff", "\U0001F600\U0001F601",
        "\U00010348 gothic", "\U0001D400 math bold", "a" * 100, "ab" * 40, "\u200d", "\u200d\u200d",
        "\ufe0f", "\u0301 leading combining",
    ]
    seen, out = set(), []
    for c in cases:
        if c not in seen:
            seen.add(c)
            out.append(c)
    rng = random.Random(7)
    # a few long mixed strings
    for _ in range(6):
        out.append(" ".join([_sentence(rng), _code(rng), _cjk(rng), _misc(rng), _hangul(rng)]))
    return out


def chat_cases():
    """Chats for apply_chat_template (messages -> rendered text -> ids)."""
    img = {"type": "image"}
    return [
        {"name": "user_only_gen", "add_generation_prompt": True,
         "messages": [{"role": "user", "content": "Hello!"}]},
        {"name": "user_only_no_gen", "add_generation_prompt": False,
         "messages": [{"role": "user", "content": "Hello!"}]},
        {"name": "custom_system", "add_generation_prompt": True,
         "messages": [{"role": "system", "content": "You are terse."},
                      {"role": "user", "content": "Count to 3."}]},
        {"name": "multi_turn", "add_generation_prompt": True,
         "messages": [{"role": "user", "content": "What is 2+2?"},
                      {"role": "assistant", "content": "4"},
                      {"role": "user", "content": "And 3+3? 用中文回答。"}]},
        {"name": "one_image", "add_generation_prompt": True,
         "messages": [{"role": "user", "content": [img, {"type": "text", "text": "Describe this image."}]}]},
        {"name": "two_images_text_between", "add_generation_prompt": True,
         "messages": [{"role": "user", "content": [{"type": "text", "text": "Compare "}, img,
                                                   {"type": "text", "text": " and "}, img,
                                                   {"type": "text", "text": "."}]}]},
        {"name": "two_images_vision_id", "add_generation_prompt": True, "add_vision_id": True,
         "messages": [{"role": "user", "content": [img, img, {"type": "text", "text": "Which is larger?"}]}]},
        {"name": "list_content_text_only", "add_generation_prompt": True,
         "messages": [{"role": "user", "content": [{"type": "text", "text": "  spaces  \n\ttab"}]}]},
        {"name": "whitespace_content", "add_generation_prompt": True,
         "messages": [{"role": "user", "content": "\n  leading and trailing  \n"}]},
    ]


LM_CHAT = [{"role": "user", "content": "What is 2+2? Answer briefly."}]


def lm_prompts():
    """(name, text) prompts for the LM goldens; 'chat' is inserted by the caller."""
    rng = random.Random(11)
    long_text = " ".join(_sentence(rng) for _ in range(14)) + "\n" + _code(rng) + _cjk(rng)
    return [
        ("short", "Hello, world!"),
        ("ascii", "The quick brown fox jumps over the lazy dog."),
        ("cjk", "你好，世界！今天天气很好。日本語のテキスト。한국어 문장입니다."),
        ("emoji", "I ❤️ 🍕 and 👨‍👩‍👧‍👦 on 🇯🇵🇫🇷! 😀👍🏽"),
        ("whitespace", "def f(x):\n\t\treturn x    \n\n\n        # comment   \r\n          end"),
        ("long", long_text),
    ]
