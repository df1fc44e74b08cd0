"""How many drafts a lossless row tries per step, for each source of drafts (docs/algorithm.md section 6.d).

The output never depends on the drafts, only the work does: a draft that fails costs its row, and a step that
feeds more than the final token costs more than an AR step. So each source adapts to how its drafts fare, and a
source whose drafts keep failing rests: a step where every source rests feeds only the final token, an AR step's
cost. A resting source tries again after `wait` quiet steps, and each try that fails doubles the wait (up to
MAX_PROBE_WAIT). While the context's copies are being tried, a resting model source waits (`DraftWindow.update`).
"""

from dataclasses import dataclass

MAX_PROBE_WAIT = 64
GROWTH = 4  # a model window whose drafts all held grows to this many times its size, or the drafts checked (up to W)
# Masks fed with a joining row's prompt (that forward is wide anyway), before the model window: their drafts reach
# past a short first item (a three-digit number and the space after it), which a first copy must match through.
JOIN_MASKS = 5
COPY_TOKENS = 12  # a copy's length at most: its tail seldom commits, and on a CPU every row fed costs
PATIENCE = 4  # context tries in a row whose first draft failed, before context drafts rest
PROBE = 2  # context drafts tried after a rest


@dataclass
class DraftWindow:
    """The model's own drafts: how many masks a row feeds. Halved at a rejection; when every draft held, made four
    times the larger of itself and the drafts just checked (on easy text a window too small costs forwards, one too
    large only rows). It starts at `smallest` after the JOIN_MASKS of the joining forward (on hard text a full window
    would mostly be wasted rows; easy text reaches W in two steps). Below `smallest` (the fewest worth a try) it is 0
    and the source rests; it then tries `smallest` drafts again, after `wait` quiet steps that are not `paused`.
    The caller pauses it while the context's copies are being tried: on text that repeats, the copies probe it,
    and a try of the model's own would turn the single-row steps between copies into wider ones (on a CPU, a
    forward of two rows costs clearly more than one of a single row)."""

    smallest: int
    size: int = 1 << 30  # capped by W where used
    wait: int = 1
    quiet: int = 0
    held: bool | None = None  # whether the last drafts checked were all accepted (None: none checked yet)

    def fitted(self, limit: int, confident: int) -> None:
        """A default-mode row's masks (docs/algorithm.md section 3.m), after a fill that saw them: GROWTH per fill
        under the threshold, at most W (`limit`); else `smallest` (AR's token and the rule's fallback fill, a draft
        that AR checks in the next forward), or 0 while the row rests (`judged`)."""
        if confident:
            self.size, self.held = min(limit, max(self.smallest, GROWTH * confident)), True
        elif self.size:  # a resting window stays at rest
            self.size, self.held = self.smallest, False

    def judged(self, checked: int, rejected: bool, paused: bool) -> None:
        """A default-mode row's unsure fills' verdicts: one rejected where the model was sure of nothing rests the
        window, as lossless mode's rests, until `wait` quiet steps that are not `paused`."""
        if checked and rejected and self.size <= self.smallest:
            self.size, self.quiet, self.wait = 0, 0, min(MAX_PROBE_WAIT, self.wait * 2)
        elif checked and not rejected:
            self.wait = 1
        elif not checked and self.size == 0 and not paused:
            self.quiet += 1
            if self.quiet >= self.wait:
                self.size = self.smallest

    def update(self, limit: int, checked: int, rejected: bool, paused: bool = False) -> None:
        if checked:
            self.held = not rejected
            current = min(self.size, limit)
            if rejected:
                self.size = current // 2 if current // 2 >= self.smallest else 0
                if self.size == 0:
                    self.wait = min(MAX_PROBE_WAIT, self.wait * 2)
                    self.quiet = 0
            else:
                self.size = min(limit, max(self.smallest, max(current, checked) * GROWTH))
                self.wait = 1
        elif self.size == 0 and not paused:
            self.quiet += 1
            if self.quiet >= self.wait:
                self.size = self.smallest


@dataclass
class ContextWindow:
    """Drafts copied from the context: the whole continuation (up to COPY_TOKENS and W; prompt lookup drafts up to
    10), for as long as the copies pay off. A copy that fails at its first token costs its rows and no forward,
    and the next one often holds (code repeats in stretches), so the source rests only after PATIENCE tries in a row
    failed at their first draft. After a rest it tries PROBE drafts: one that fails sends it back to rest, one that
    commits a draft ends the streak and the next copy is whole again."""

    size: int = 1 << 30  # 0 while resting; otherwise capped by COPY_TOKENS and W where used
    wait: int = 1
    quiet: int = 0
    failures: int = 0  # tries in a row whose first draft failed
    tried: bool = False  # whether any copy was checked yet

    @property
    def trying(self) -> bool:
        """Whether copies are being tried: one was, and the source does not rest."""
        return self.tried and self.size != 0

    def update(self, limit: int, checked: int, rejected: bool) -> None:
        if checked:
            self.tried = True
            if rejected and checked == 1:
                self.failures += 1
            else:
                self.failures, self.wait = 0, 1
            if self.failures >= PATIENCE:
                self.size, self.failures, self.quiet = 0, PATIENCE - 1, 0
                self.wait = min(MAX_PROBE_WAIT, self.wait * 2)
            else:
                self.size = limit
        elif self.size == 0:
            self.quiet += 1
            if self.quiet >= self.wait:
                self.size = PROBE
