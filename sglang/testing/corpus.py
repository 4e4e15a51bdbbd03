"""A small, deterministic English-ish text corpus for training the test tokenizer.

Everything here is generated from fixed word lists with a fixed-seed ``random.Random``,
so the corpus (and therefore the trained tokenizer) is byte-identical on every run and
every machine.  It is deliberately modest (a few hundred KB) so BPE training stays fast.
"""

from __future__ import annotations

import random
from functools import lru_cache

CORPUS_VERSION = 1

_NOUNS = """
time year people way day man woman child world life hand part place case week company
system program question work government number night point home water room mother area
money story fact month lot right study book eye job word business issue side kind head
house service friend father power hour game line end member law car city community name
president team minute idea kid body information back parent face others level office door
health person art war history party result change morning reason research girl guy moment
air teacher force education picture image photo video camera screen window table chair
dog cat bird horse fish tree flower garden river mountain ocean sky sun moon star cloud
road bridge train plane boat street market shop school student library museum hospital
doctor nurse computer phone keyboard model token language answer problem solution color
shape circle square triangle box ball cup bottle apple banana orange bread cheese coffee
tea music song movie scene frame pixel object person animal vehicle building kitchen
""".split()

_VERBS = """
is was has had does said made went took came saw knew got gave found thought told became
showed left felt brought began kept held wrote stood heard meant set met ran paid sat spoke
lay led read grew lost fell sent built understood drew broke spent cut rose drove bought
wore chose describes shows contains holds carries watches opens closes moves jumps runs
walks looks sees finds makes takes gives writes reads paints draws counts answers explains
""".split()

_ADJECTIVES = """
good new first last long great little own other old right big high different small large
next early young important few public bad same able red blue green yellow black white
bright dark happy sad quick slow quiet loud warm cold soft hard simple clear round square
tall short heavy light wooden metal glass empty full open closed clean dirty strange
""".split()

_ADVERBS = "quickly slowly quietly clearly carefully really often never always sometimes".split()
_DETERMINERS = "the a this that every some one two three several many no".split()
_PREPOSITIONS = "in on at under over behind near beside between with without into from".split()
_PRONOUNS = "I you he she it we they".split()
_CONJ = "and but or so because while although".split()
_NAMES = "Alice Bob Carol Dave Eve Frank Grace Heidi Ivan Judy Mallory Oscar Peggy Trent".split()
_PLACES = "Paris London Tokyo Berlin Cairo Lima Oslo Rome Seoul Sydney Toronto Beijing".split()

_UNICODE_LINES = [
    "Café, naïve, façade, résumé, jalapeño, Zürich, São Paulo, Ångström.",
    "Ελληνικά γράμματα: α β γ δ ε. Русский текст: привет, мир.",
    "中文：你好，世界。这是一张图片。日本語：こんにちは。한국어: 안녕하세요.",
    "Emoji: 😀 🎉 🐱 🚀 ✅ — “quotes” and ‘apostrophes’ … ½ ¼ € £ ¥ © ®.",
    "Math: x² + y² = z², ∑ᵢ aᵢ, √2 ≈ 1.414, π ≈ 3.14159, ∞ ≠ 0, ≤ ≥ ±.",
]

_CODE_LINES = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * 2)\n",
    'import json\ndata = {"key": "value", "count": 3}\nprint(json.dumps(data))\n',
    "if (x > 0 && y < 10) { return x * y; } else { return -1; }\n",
    "SELECT name, age FROM users WHERE age >= 18 ORDER BY name;\n",
    "<html><body><p>Hello, world!</p></body></html>\n",
    "https://example.com/path?query=1&page=2#section\n",
    "user@example.com, 192.168.0.1, 2024-01-31 12:34:56, $19.99, 50%\n",
]

_PROSE = """\
The quick brown fox jumps over the lazy dog. A picture is worth a thousand words.
Describe the image in detail. What is shown in this picture? How many objects are there?
The image shows a small red ball on a wooden table next to a glass of water.
User: Please describe this photo. Assistant: The photo shows a cat sitting on a chair.
There are two dogs in the garden, and one of them is running towards the camera.
In the video, a man walks across the street while the traffic light turns green.
Question: What color is the car? Answer: The car is blue.
system
You are a helpful assistant.
user
What is in this image?
assistant
The image contains a dog, a ball and a tree.
"""


def _sentence(rng: random.Random) -> str:
    kind = rng.randrange(8)
    n1, n2 = rng.choice(_NOUNS), rng.choice(_NOUNS)
    adj, verb = rng.choice(_ADJECTIVES), rng.choice(_VERBS)
    det1, det2 = rng.choice(_DETERMINERS), rng.choice(_DETERMINERS)
    if kind == 0:
        s = f"{det1} {adj} {n1} {verb} {det2} {n2}."
    elif kind == 1:
        s = f"{rng.choice(_NAMES)} {verb} {det1} {n1} {rng.choice(_PREPOSITIONS)} {rng.choice(_PLACES)}."
    elif kind == 2:
        s = f"{rng.choice(_PRONOUNS)} {rng.choice(_ADVERBS)} {verb} {det1} {n1}, {rng.choice(_CONJ)} {det2} {n2} {rng.choice(_VERBS)}."
    elif kind == 3:
        s = f"What {verb} {det1} {adj} {n1} {rng.choice(_PREPOSITIONS)} the {n2}?"
    elif kind == 4:
        s = f"There are {rng.randint(0, 999)} {n1}s and {rng.randint(0, 99)} {n2}s in the {rng.choice(_NOUNS)}."
    elif kind == 5:
        s = f'"{adj.capitalize()} {n1}!" said {rng.choice(_NAMES)}; it was {rng.randint(1, 12)}:{rng.randint(0, 59):02d}.'
    elif kind == 6:
        s = f"In {rng.randint(1900, 2030)}, {det1} {n1} {verb} {rng.randint(2, 100)} {n2}s ({rng.random():.3f})."
    else:
        s = f"{det1} {n1} {rng.choice(_PREPOSITIONS)} {det2} {adj} {n2} {rng.choice(_ADVERBS)} {verb}."
    return s[0].upper() + s[1:]


@lru_cache(maxsize=4)
def corpus_lines(num_paragraphs: int = 1500, seed: int = 20240531) -> tuple[str, ...]:
    """Return the corpus as a tuple of paragraphs (deterministic)."""
    rng = random.Random(seed)
    lines: list[str] = [_PROSE] * 3 + _UNICODE_LINES * 4 + _CODE_LINES * 4
    for i in range(num_paragraphs):
        para = " ".join(_sentence(rng) for _ in range(rng.randint(2, 6)))
        if i % 50 == 0:
            para += "\n" + rng.choice(_UNICODE_LINES)
        if i % 40 == 0:
            para += "\n" + rng.choice(_CODE_LINES)
        lines.append(para + "\n")
    return tuple(lines)


def corpus_text() -> str:
    return "".join(corpus_lines())
