"""
tokenizer_fixture.py - the byte-level BPE tokenizer fixture (tests/tokenizer/data/).

Builds, with the HF `tokenizers` library, a small tokenizer that has the same structure as the
DeepSeek-LLM / Janus-Pro tokenizer.json: no normalizer, a pre-tokenizer Sequence of six
Isolated Split regexes followed by ByteLevel(add_prefix_space=False, use_regex=False), a BPE
model, and the Janus special tokens appended after the BPE ids as added tokens. It is trained on
a deterministic corpus written below (English, code, digits, punctuation, CJK, Hangul, emoji),
then used to encode tricky strings; the C tokenizer must reproduce every id list.

The regexes follow llama.cpp `llama-vocab.cpp` (pre-tokenizer "deepseek-llm"), whose strings are
copied from deepseek-ai's tokenizer.json. The letter class is written as code-point ranges, not
literal characters: several of its members (U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126, U+212A)
change under Unicode NFC normalisation, and a text copy that normalises them breaks the class.
Training the real 100k vocabulary is out of scope: the fixture checks the algorithm, not ids.

build_gpt2 makes the second tokenizer, the GPT-2 / OPT layout of the OPT golden fixture
(tests/golden/data/opt/): ByteLevel pre-tokenizer with the GPT-2 split regex and no prefix space,
ByteLevel decoder, no post-processor (flexdiag adds the BOS itself), OPT's special tokens at ids
0..3, then the 256 byte symbols and the merges learnt from the English block below.
"""

import json
import random

BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
PAD = "<\uff5c\u2581pad\u2581\uff5c>"
SPECIAL_TOKENS = [BOS, EOS, PAD, "<|User|>", "<|Assistant|>", "<image_placeholder>",
                  "<begin_of_image>", "<end_of_image>"]
BOI = "<begin_of_image>"
VOCAB_TARGET = 3000  # BPE ids before the added tokens (brief: about 3000)

# Cased letters (Unicode LC) as used by the DeepSeek-LLM letter Split, in code points.
LETTER_RANGES = [
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA),
    (0x1BC, 0x1BF), (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x376), (0x377, 0x377),
    (0x37B, 0x37D), (0x37F, 0x37F), (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C),
    (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481), (0x48A, 0x52F), (0x531, 0x556),
    (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA), (0x1CBD, 0x1CBF),
    (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B),
    (0x1F5D, 0x1F5D), (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE),
    (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC), (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC),
    (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102), (0x2107, 0x2107), (0x210A, 0x2113),
    (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126), (0x2128, 0x2128),
    (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F), (0x2145, 0x2149),
    (0x214E, 0x214E), (0x2183, 0x2183), (0x2184, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4),
    (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF2), (0x2CF3, 0x2CF3), (0xA640, 0xA66D), (0xA680, 0xA69B),
    (0xA722, 0xA76F), (0xA771, 0xA787),
    (0xA78B, 0xA78E), (0xAB70, 0xABBF), (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A),
    (0xFF41, 0xFF5A), (0x10400, 0x1044F), (0x104B0, 0x104D3), (0x104D8, 0x104FB),
    (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF), (0x1E900, 0x1E943),
]
# ASCII and fullwidth punctuation, general punctuation quotes, ideographic space/comma/stop.
PUNCT_RANGES = [(0x21, 0x2F), (0x3A, 0x7E), (0xFF01, 0xFF0F), (0xFF1A, 0xFF5E),
                (0x2018, 0x201F), (0x3000, 0x3002)]
# CJK ideographs, U+0800..U+4E00 (kana, CJK symbols, extension A, ...), Hangul syllables+.
CJK_RANGES = [(0x4E00, 0x9FA5), (0x0800, 0x4E00), (0xAC00, 0xD7FF)]


def char_class(ranges):
    """Regex character-class body for code-point ranges, as literal characters."""
    parts = []
    for lo, hi in ranges:
        parts.append(chr(lo) if lo == hi else chr(lo) + "-" + chr(hi))
    return "".join(parts)


def split_patterns():
    """The six Split regexes of the DeepSeek-LLM pre-tokenizer, in order."""
    return [
        "[\r\n]",
        "\\s?[" + char_class(LETTER_RANGES) + "]+",
        "\\s?[" + char_class(PUNCT_RANGES) + "]+",
        "\\s+$",
        "[" + char_class(CJK_RANGES) + "]+",
        "\\p{N}+",
    ]


# ---- training corpus (deterministic, written for this fixture) ----

ENGLISH = """The lighthouse keeper wrote a letter every evening and never sent any of them.
A small boat drifted past the harbour wall while gulls argued over a fish.
Rain fell on the tin roof, so the children counted seconds between thunder and lightning.
She tuned the old piano by ear, one string at a time, humming the missing notes.
Maps are promises that the ground will stay where somebody once drew it.
If the train leaves at noon and travels north, where will the baker be at three?
Bread rises faster in a warm kitchen; patience rises slower in a cold one.
The museum closed early because the dinosaur skeleton needed a new bolt in its tail.
Nobody remembered who planted the orchard, but everyone picked its apples in autumn.
A careful reader notices commas; a hurried reader notices only the ending.
Quantum computers, classical computers and pocket calculators all disagree about rounding.
He painted the fence blue, then green, then blue again, and finally left it unpainted.
The recipe said a pinch of salt, which is a unit nobody has ever standardised.
Astronomers pointed the telescope at a faint smudge that turned out to be a galaxy.
Our cat believes the vacuum cleaner is a dragon and hides under the bed accordingly.
Winter mornings smell of smoke, frost and the faint promise of hot chocolate.
The committee met for four hours and agreed only to meet again next Tuesday.
Every library has one shelf where the books seem to rearrange themselves overnight.
A red kite circled above the valley, riding warm air without moving its wings.
The engineer measured twice, cut once, and still had to order another plank.
Please remember to water the tomatoes, feed the fish and lock the garden gate.
Historians argue about dates; farmers argue about weather; both are usually right.
The violinist missed the bus, ran across town and arrived just before the encore.
Sunlight through the stained glass painted the stone floor in moving colours.
Write tests first, then write the code, then discover the tests were wrong.
An image generator turns a short prompt into a grid of discrete visual tokens.
The decoder upsamples the latent grid until every token becomes a patch of pixels.
Classifier-free guidance mixes conditional and unconditional logits with a weight.
Attention heads look back at earlier tokens and decide which ones matter now.
A key-value cache stores past keys and values so decoding does not repeat work.
Offloading moves weights between disk, host memory and the accelerator on a schedule.
Sparse attention keeps the diagonal band and a few important columns of the matrix.
Photograph of a quiet mountain lake at sunrise, mist over the water, pine trees.
A watercolor painting of a fox sleeping in a field of lavender under the stars.
Isometric illustration of a tiny cafe with plants, warm lights and a bicycle outside.
Close-up portrait of an old sailor with a white beard, dramatic lighting, 85mm lens.
A futuristic city skyline at dusk with flying trains and glass towers, cinematic.
Still life of lemons, a blue jug and a folded napkin on a wooden table.
An astronaut riding a horse on the moon, highly detailed, digital art.
Cute cartoon panda eating bamboo, simple shapes, pastel colours, white background."""

CODE = """def softmax(x):
    m = max(x)
    e = [math.exp(v - m) for v in x]
    return [v / sum(e) for v in e]
int main(int argc, char **argv) { printf("%d\\n", argc); return 0; }
for (size_t i = 0; i < n; ++i) { y[i] += alpha * x[i]; }
if (status != FLEXDIAG_OK) return flexdiag__err(status, "file %s: bad header", path);
const float scale = 1.0f / sqrtf((float)head_dim);
#include <stdint.h>
#define MAX_DIMS 8
x = torch.randn(4, 64, dtype=torch.float32)
print(f"loss={loss:.4f} step={step} lr={lr:.2e}")
{"name": "flexdiag", "version": "0.1.0", "layers": [0, 1, 2, 3]}
SELECT id, name FROM users WHERE age >= 18 ORDER BY name;
git commit -m "fix: handle empty prompt"
meson setup build && ninja -C build && meson test -C build
let total = items.iter().map(|x| x.price * x.qty).sum::<u64>();
function add(a, b) { return a + b; } // adds two numbers
<div class="card"><span>Hello</span></div>
a[i][j] = (a[i-1][j] + a[i][j-1]) % 1000000007;
while (!done && retries-- > 0) { done = try_once(); }
return x << 3 | (y >> 2) & 0xFF;"""

NUMBERS = """In 2024 the survey counted 1234567 birds across 89 sites.
Pi is roughly 3.14159265358979 and e is about 2.718281828.
The invoice total was $1,299.99 plus 20% tax, due on 2025-03-31.
Call +44 20 7946 0958 or +1 (555) 010-4477 before 17:45.
Version 10.42.1 fixed 37 bugs and introduced 2 new ones.
Temperatures ranged from -12.5 to 38.25 degrees over 365 days.
The matrix was 4096 x 11008 and took 90112 kilobytes in bfloat16.
Room 404, floor 7, building 12B, postcode 90210.
Scores: 98, 87, 76, 65, 54, 43, 32, 21, 10, 0.
0.5 + 0.25 + 0.125 + 0.0625 approaches 1.
ISBN 978-3-16-148410-0, page 256 of 1024.
Coordinates 48.8584 N, 2.2945 E; altitude 330 m."""

MULTILINGUAL = """Le café est très chaud ; l'élève préfère le thé à la menthe.
Der Bäcker verkauft Brötchen, Brezeln und süße Teilchen in der Straße.
El niño comió una manzana y después jugó al fútbol con su abuela.
Ångström, smörgåsbord och Øresund är ord med ovanliga bokstäver.
Zażółć gęślą jaźń — to zdanie zawiera wszystkie polskie litery.
Ελληνικά: η γλώσσα των φιλοσόφων και των μαθηματικών.
Русский язык: быстрая коричневая лиса прыгает через ленивую собаку.
Українська мова має літери ї, є та ґ.
今天天气很好，我们一起去公园散步吧。
我喜欢读书，也喜欢在晚上听音乐。
这个模型可以根据文字描述生成图像。
一只可爱的熊猫坐在竹林里吃竹子。
北京是中国的首都，上海是一座国际化的大城市。
他说：“明天见！”然后就走了。
机器学习需要大量的数据和计算资源。
请把这段文字翻译成英文，谢谢。
春天来了，花开了，小鸟在树上唱歌。
日本語の文章にはひらがなとカタカナと漢字が混ざっています。
東京の夜景はとても綺麗です。
ラーメンとおにぎりを食べました。
안녕하세요, 만나서 반갑습니다.
오늘 날씨가 정말 좋네요. 산책하러 갈까요?
한국어는 한글로 쓰며 음절 단위로 모아 씁니다.
이 모델은 텍스트를 이미지로 바꿉니다.
서울의 봄은 벚꽃으로 가득합니다.
Emoji party 😀😃😄😁 🎉🎊 🐱🐶🐼 ❤️💙💚
Family 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵🇰🇷 with skin tones 👍🏻👍🏽👍🏿
Weather today: ☀️ then 🌧️ and later ⛈️ — bring an umbrella ☂️"""

# Runs of one symbol make merges like "a a" whose order matters inside "aaaa" (BPE ranks).
REPEATS = r"""Hello hello HELLO, hello world! Hellooo there, hello again.
aaaa aaaaaaaa aaaaaaaaaaaa bbbb bbbbbb zzzz zzzzzzzz hmmmm mmm ooooh shhhh
Ahhh... Ohhh!!! Wheeee --- ==== ____ **** #### //// \\\\ ~~~~
1111 2222 00000 9999 123123 4444 1000000 2020 2021 2022 2023 2024 2025
!!!!!!! ?????? ...... ------ ,,,, ;;;; :::: '''' """ + '""""' + """ ))))((((
一一一一 哈哈哈哈哈 ㄱㄱㄱ ㅋㅋㅋㅋ 하하하 ーーーー"""

WORDS = ("time person year way day thing man world life hand part child eye woman place work "
         "week case point government company number group problem fact be have do say get make "
         "go know take see come think look want give use find tell ask seem feel try leave call "
         "good new first last long great little own other old right big high different small "
         "large next early young important few public bad same able red blue green yellow black "
         "white orange purple silver golden ancient modern quiet loud bright dark soft sharp "
         "mountain river forest ocean desert island valley city village garden street bridge "
         "castle tower window door table chair lamp book letter clock mirror painting camera "
         "robot dragon tiger rabbit horse whale eagle owl fox wolf bear panda kitten puppy "
         "sunset sunrise winter summer autumn spring morning evening midnight storm rainbow "
         "photograph illustration sketch render portrait landscape watercolor oil pencil "
         "detailed realistic cinematic minimal surreal vintage futuristic cozy dramatic").split()
HANZI = ("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过"
         "家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所"
         "本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全"
         "工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教"
         "西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性")
HANGUL = "가나다라마바사아자차카타파하고노도로모보소오조초코토포호구누두루무부수우주추쿠투푸후"


def _generated_lines(rng, count):
    """Template sentences mixing the word list, numbers, hanzi and hangul."""
    lines = []
    for i in range(count):
        w = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
        kind = i % 6
        if kind == 0:
            line = " ".join(w).capitalize() + "."
        elif kind == 1:
            line = "A %s of a %s %s, %d%% %s." % (w[0], w[1], w[2], rng.randint(1, 100), w[3])
        elif kind == 2:
            line = "%s_%s = %d  # %s" % (w[0], w[1], rng.randint(0, 99999), " ".join(w[2:]))
        elif kind == 3:
            line = "".join(rng.choice(HANZI) for _ in range(rng.randint(6, 20))) + "。"
        elif kind == 4:
            line = " ".join("".join(rng.choice(HANGUL) for _ in range(rng.randint(2, 4)))
                            for _ in range(rng.randint(3, 7))) + "."
        else:
            line = "%s: %s (%s)!" % (w[0].upper(), ", ".join(w[1:]), rng.choice(["yes", "no"]))
        lines.append(line)
    return lines


def corpus(seed):
    """All training lines: the handwritten blocks plus generated ones."""
    lines = []
    for block in (ENGLISH, CODE, NUMBERS, MULTILINGUAL, REPEATS):
        lines.extend(block.split("\n"))
    lines.extend(_generated_lines(random.Random(seed), 1500))
    return lines


# ---- test strings ----

CASES = [
    "Hello world", "Hello, world!", "  two leading spaces", "trailing spaces   ",
    "multiple   spaces   inside", "tabs\there\tand\t\tthere", "line one\nline two",
    "para one\n\npara two", "windows\r\nline endings\r\n", "\n\n", "\n", "", " ", "   ",
    "1234567", "pi is 3.14159, e is 2.71828", "phone: +1 (555) 010-9999", "2025-12-31T23:59:59Z",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 fa\u00e7ade",
    "decomposed e\u0301 vs composed \u00e9", "\u00c5ngstr\u00f6m \u00d8resund Stra\u00dfe",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac "
    "\u03b3\u03c1\u03ac\u03bc\u03bc\u03b1\u03c4\u03b1",
    "\u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442, "
    "\u043f\u0440\u0438\u043c\u0435\u0440.",
    "\u4e2d\u6587\u5206\u8bcd\u6d4b\u8bd5\uff1a\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u30ab\u30bf\u30ab\u30ca",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4. \uc548\ub155\ud558\uc138\uc694!",
    "emoji \U0001F600\U0001F603\U0001F604",
    "family \U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 zwj",
    "flags \U0001F1FA\U0001F1F8\U0001F1EF\U0001F1F5", "skin tone \U0001F44D\U0001F3FD",
    "heart \u2764\ufe0f variation selector",
    "<|User|>: draw a cat\n\n<|Assistant|>:", "text<begin_of_image>more<end_of_image>",
    BOS + "hello" + EOS, "<image_placeholder><image_placeholder>", PAD + " padded " + PAD,
    "almost special <|User| > and <begin_of_image", "<|User|><|Assistant|>",
    "def f(x):\n    return x ** 2  # square", "int main(void) { return 0; }",
    "{\"key\": [1, 2, 3], \"ok\": true}", "https://example.com/path?q=1&r=two#frag",
    "mixed\u4e2d\u6587and English123\u6df7\u5408",
    "full width: \uff21\uff22\uff23\uff11\uff12\uff13\uff01",
    "ideographic\u3000space and nbsp\u00a0here", "spaces before newline   \nnext",
    "    indented code", "!!!???...---", "don't won't it's", "UPPER lower MiXeD",
    "\u00bd \u00bc \u00b2 \u00b3 \u216b \u0663", "zero\u200bwidth space",
    "control\u0001char\u007f", "\t\t\n \n", "a\r\rb",
    "\U0001D518\U0001D52B\U0001D526\U0001D520\U0001D52C\U0001D521\U0001D522 math letters",
    "\u00c0\u00c9\u00ce\u00d5\u00dc uppercase accents", "\u01c4 \u01c5 \u01c6 digraphs",
    "\ufb01 ligature and \uff2b fullwidth", "\u212a Kelvin \u2126 Ohm \u1fbe iota",
    "a" * 40, "ends with newline\n", " \n leading space newline", "tab at end\t",
    "A photo of a mountain lake at sunrise, 4k",
]

JANUS_PROMPTS = [
    "a red cat", "  A photo of a mountain lake at sunrise, 4k  ",
    "\u4e00\u53ea\u53ef\u7231\u7684\u718a\u732b", "emoji \U0001F431 and numbers 2025",
    "line\nbreak prompt", "", "Cute cartoon panda eating bamboo, pastel colours",
]


def janus_text(prompt):
    """docs/architecture.md §4.1: the sft template with an empty system prompt, stripped."""
    return ("<|User|>: " + prompt.strip() + "\n\n<|Assistant|>:").strip()


def build(seed, log):
    """Train the fixture tokenizer; returns the tokenizers.Tokenizer."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers import trainers

    splits = [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False)
              for p in split_patterns()]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(splits + [byte_level])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_TARGET, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    lines = corpus(seed)
    tok.train_from_iterator(lines, trainer=trainer)
    n_bpe = tok.get_vocab_size(with_added_tokens=False)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False)
                            for s in SPECIAL_TOKENS])
    log("tokenizer: %d corpus lines, %d BPE ids, %d with added tokens"
        % (len(lines), n_bpe, tok.get_vocab_size(with_added_tokens=True)))
    return tok


def special_ids(tok):
    """Every special token's id, by exact string (as the C side must look them up)."""
    ids = {}
    for s in SPECIAL_TOKENS:
        i = tok.token_to_id(s)
        if i is None:
            raise RuntimeError("tokenizer fixture: special token %r has no id" % s)
        ids[s] = i
    return ids


def janus_prompt_ids(tok, prompt):
    """[BOS] + encode(template) + [BOI]; also checks that encoding BOI in text agrees."""
    ids = special_ids(tok)
    text = janus_text(prompt)
    body = tok.encode(text, add_special_tokens=False).ids
    inline = tok.encode(text + BOI, add_special_tokens=False).ids
    if inline != body + [ids[BOI]]:
        raise RuntimeError("tokenizer fixture: <begin_of_image> inside the text encodes as %r"
                           % inline[len(body):])
    return text, [ids[BOS]] + body + [ids[BOI]]


def cases_document(tok, versions):
    """The cases.json content: encodings of CASES and Janus prompt ids."""
    cases = []
    for text in CASES:
        enc = tok.encode(text, add_special_tokens=False)
        cases.append({"text": text, "ids": enc.ids, "tokens": enc.tokens})
    prompts = []
    for p in JANUS_PROMPTS:
        text, ids = janus_prompt_ids(tok, p)
        prompts.append({"prompt": p, "text": text, "ids": ids})
    return {
        "magic": "flexdiag-golden", "version": 1,
        "generator": "tools/golden/make_fixtures.py", "tokenizers": versions["tokenizers"],
        "tokenizer": "tokenizer.json",
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "special_ids": special_ids(tok),
        "note": "cases: ids = encode(text, add_special_tokens=False), no BOS; janus_prompts: "
                "ids = [BOS] + encode(text) + [<begin_of_image>], text = template, stripped",
        "cases": cases, "janus_prompts": prompts,
    }


def write(tok, out_dir, versions, log):
    """Write tokenizer.json and cases.json into out_dir; returns the cases document."""
    import os
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    doc = cases_document(tok, versions)
    with open(os.path.join(out_dir, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    bad = [c["text"] for c in doc["cases"]
           if tok.decode(c["ids"], skip_special_tokens=False) != c["text"]]
    log("tokenizer: %d cases, %d janus prompts; decode round trip differs for %d: %r"
        % (len(doc["cases"]), len(doc["janus_prompts"]), len(bad), bad[:5]))
    return doc


# ---- GPT-2 / OPT byte-level BPE (the OPT golden fixture) ----

OPT_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0..3, as in OPT's tokenizer

# Strings where the GPT-2 split regex matters: contractions (lower case only), letter / digit /
# other runs with one optional leading space, whitespace runs before a word (\s+(?!\S)),
# trailing whitespace, OPT's special tokens inside text, non-ASCII letters and bytes the
# training corpus never had (no merges: one byte symbol each).
GPT2_CASES = [
    "Hello world", "Hello, world!", "The lighthouse keeper wrote a letter",
    "don't won't it's we're they've I'm you'll he'd", "DON'T IT'S I'LL", "'s's 'tis ''",
    "  two leading spaces", "trailing spaces   ", "multiple   spaces   inside",
    "tabs\there\t\tand there", "line one\nline two", "para one\n\n\npara two",
    "spaces before newline   \nnext", " \n leading space newline", "x  \ny", "\n", " ", "   ", "",
    "numbers 1234567 and 3.14159, 2025-12-31", "mixed123abc456", "!!!???... --- ***",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9", "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac",
    "\u4e2d\u6587\u6d4b\u8bd5",
    "emoji \U0001F600 family \U0001F468\u200d\U0001F469\u200d\U0001F467",
    "nbsp\u00a0here and ideographic\u3000space", "control\u0001char\u007f",
    "</s>after the end", "<s> start <pad> padded <unk> unknown </s>", "almost </s > and <s",
    "a" * 40, "ends with newline\n",
]


def build_gpt2(vocab_size, log):
    """GPT-2 / OPT-style byte-level BPE of exactly vocab_size ids trained on ENGLISH: the
    OPT specials (0..3), the 256 byte symbols, then merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=OPT_SPECIALS)
    lines = ENGLISH.split("\n")
    tok.train_from_iterator(lines, trainer=trainer)
    ids = [tok.token_to_id(s) for s in OPT_SPECIALS]
    n = tok.get_vocab_size(with_added_tokens=True)
    log("gpt2 tokenizer: %d corpus lines, %d ids, specials %s -> %s, post_processor %s"
        % (len(lines), n, OPT_SPECIALS, ids, tok.post_processor))
    if ids != list(range(len(OPT_SPECIALS))) or n != vocab_size:
        raise RuntimeError("gpt2 tokenizer: want specials at 0..3 and %d ids, got %s and %d "
                           "(too few merges in the corpus?)" % (vocab_size, ids, n))
    return tok


def gpt2_cases_document(tok, versions):
    """The tokenizer_cases.json content: each GPT2_CASES string with its ids (encode without
    special tokens: no BOS), pieces, and decodes with and without the special tokens."""
    cases = []
    for text in GPT2_CASES:
        enc = tok.encode(text, add_special_tokens=False)
        cases.append({"text": text, "ids": enc.ids, "tokens": enc.tokens,
                      "decoded": tok.decode(enc.ids, skip_special_tokens=True),
                      "decoded_all": tok.decode(enc.ids, skip_special_tokens=False)})
    return {
        "magic": "flexdiag-golden", "version": 1,
        "generator": "tools/golden/make_fixtures.py", "tokenizers": versions["tokenizers"],
        "tokenizer": "tokenizer.json",
        "note": "ids = encode(text, add_special_tokens=False); decoded / decoded_all = "
                "decode(ids, skip_special_tokens=True / False)",
        "cases": cases,
    }
