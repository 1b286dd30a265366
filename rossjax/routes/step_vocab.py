r"""Per-domain step vocabularies for route fingerprints, kept as data (edit here, not in code).

Each domain maps to an ordered list of (label, cues). A cue is a regular expression matched
against the lower-cased step text; a step takes the label of its highest-priority cue (earlier in
the list wins), `tool` if it is a tool call with no cue, else `other`. Cues only match at the
start of a word (after a non-letter) and may match a prefix ("verif" covers verify/verified/
verification), so paraphrases that keep a step's role keep its label. A cue must start with a
letter, digit, space, quote, a `(` group of words, an escaped punctuation character (`\\boxed`
as a regex) or `\d`; a trailing space means "followed by whitespace". The label ORDER is part of the
fingerprint: appending labels is safe, reordering changes every vector.

`verify` and `backtrack` names matter: path statistics count them (first verification position,
number of backtracks), so every domain should name its checking step `verify` and its correcting
step `backtrack` when it has one.
"""

STEP_VOCAB = {
    "math": [
        ("backtrack", [r"wait", r"oops", r"mistake", r"(that|this) (is|was) (wrong|incorrect)",
                       r"incorrect", r"actually,", r"let me (redo|re-?do|reconsider|start over|correct)",
                       r"reconsider", r"correction", r"i made an error", r"scratch that",
                       r"on second thought", r"that can'?t be right"]),
        ("verify", [r"check", r"verif", r"double-check", r"sanity", r"confirm", r"plug(ging)? (it |this |x )?back",
                    r"indeed", r"consistent with", r"as expected", r"test(ing)? (this|the|it)"]),
        ("conclude", [r"therefore", r"thus the answer", r"hence the answer", r"the answer is",
                      r"final answer", r"\\boxed", r"in conclusion", r"so the (final )?result",
                      r"we conclude", r"which gives the answer", r"altogether the answer"]),
        ("case_split", [r"case", r"either", r"otherwise", r"split (into|on)", r"on the other hand",
                        r"separately", r"two possibilities", r"subcase"]),
        ("hypothesize", [r"guess", r"conjecture", r"maybe", r"perhaps", r"hypothes", r"assume",
                         r"it seems", r"might be", r"could be", r"presumably"]),
        ("substitute", [r"substitut", r"plug", r"replac", r"rewrit", r"transform", r"simplif",
                        r"expand", r"factor", r"rearrang", r"in terms of", r"change of variable"]),
        ("setup", [r"let ", r"define", r"denote", r"we are given", r"given that", r"we need to",
                   r"set up", r"the problem (asks|says)", r"we want", r"our goal", r"call (it|this|the)",
                   r"write (the|an?) equation", r"suppose"]),
        ("compute", [r"comput", r"calculat", r"evaluat", r"multiply", r"multiplying", r"divid", r"add",
                     r"subtract", r"sum", r"product", r"work(ing)? out", r"solv", r"gives", r"equals",
                     r"\d+ ?[-+*/^=] ?\d+"]),
    ],
    "code": [
        ("debug", [r"bug", r"fix", r"error", r"traceback", r"exception", r"fail", r"wrong",
                   r"doesn'?t work", r"off-by-one", r"debug", r"patch", r"wait"]),
        ("run", [r"run", r"test", r"execut", r"pytest", r"assert", r"output", r"pass(es|ed)?\b",
                 r"python ", r"bash"]),
        ("conclude", [r"final (code|solution|answer)", r"in conclusion", r"done", r"complete",
                      r"here is the", r"the solution (is|works)", r"submit"]),
        ("read", [r"read", r"look at", r"inspect", r"open", r"cat ", r"grep", r"search", r"view",
                  r"the (function|file|module|class) (is|has|contains)", r"existing"]),
        ("write", [r"writ", r"implement", r"def ", r"class ", r"add(ing)? (a|the)", r"creat", r"edit",
                   r"return ", r"code"]),
        ("plan", [r"plan", r"approach", r"idea", r"first,? (we|i)", r"step \d", r"we need",
                  r"i will", r"i'll", r"let'?s", r"strategy", r"the task"]),
    ],
    "puzzle": [
        ("backtrack", [r"backtrack", r"undo", r"wait", r"dead end", r"contradiction", r"go back",
                       r"revert", r"doesn'?t work", r"impossible", r"wrong"]),
        ("verify", [r"check", r"verif", r"confirm", r"valid", r"satisf", r"consistent"]),
        ("conclude", [r"solved", r"solution is", r"the answer", r"final", r"therefore", r"done"]),
        ("move", [r"move", r"place", r"put", r"set", r"fill", r"try", r"swap", r"shift", r"go",
                  r"assign", r"mark", r"take"]),
    ],
}
