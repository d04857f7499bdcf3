"""A host's side of a refusal for settings (messages.SettingsRefusal), for the daemon and the edge client.

A member whose run id is not ours is refused (``config_mismatch``), and a digest cannot say what
differs. So the refuser answers it with its own shared settings, flattened, at most once per
interval (protocols/settings_diff.MismatchAnswers), and the refused member names the first key
where the two part: ``gw0 refuses us: [federation] differs (fraction 0.5 at gw0 != 0.3 here)``.
The decision and the words are protocols/settings_diff.py's; here they meet the endpoint's seal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protocols.messages import SettingsRefusal
from protocols.settings_diff import MismatchAnswers, flatten, refusal_line
from protocols.wire import Endpoint, Frame, Rejection, wire_messages


class SettingsRefusals:
    """Answers to members refused for their run id, and the lines refusals we receive give."""

    def __init__(self, endpoint: Endpoint, shared: Mapping[str, Any], *, interval_s: float) -> None:
        """``shared``: our settings as the run id digests them (``PeerConfig.shared()``)."""
        self.endpoint = endpoint
        self.shared = shared
        self.answers = MismatchAnswers(interval_s)
        self._message = SettingsRefusal(meta=flatten(shared))
        self.answered = 0     # refusals sent

    def answer(self, rejection: Rejection, now: float) -> list[Frame] | None:
        """The sealed refusal to send ``rejection``'s sender, when it is one for its run id (a roster
        member: the run id is checked after the signature) and one is due; else None."""
        if rejection.reason != "config_mismatch" or not rejection.sender:
            return None
        if not self.answers.due(rejection.sender, now):
            return None
        self.answered += 1
        return wire_messages(self.endpoint.seal((rejection.sender,), self._message))

    def heard(self, sender: str, refusal: SettingsRefusal) -> str:
        return heard(sender, self.shared, refusal)


def heard(sender: str, shared: Mapping[str, Any], refusal: SettingsRefusal) -> str:
    """What a member whose settings are ``shared`` says on a refusal ``sender`` sent it (the
    settings it carries are untrusted words: compared and shown, nothing else)."""
    theirs = {str(key): str(value) for key, value in refusal.meta.items()}
    return refusal_line(sender, shared, theirs)
