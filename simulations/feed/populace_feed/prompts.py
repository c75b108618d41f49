"""What an agent is asked: the system prompt every request shares, its feed as numbered posts,
and the answer's schema (one structured call: stance, post, like, repost, follow, unfollow)."""

from __future__ import annotations

import json
from functools import lru_cache

from populace_feed.recommender import Timeline

PROMPT_VERSION = "feed-1"


def stance_label(stance: int, scale: int) -> str:
    """In words: 'strongly for' … 'neutral' … 'strongly against'."""
    if stance == 0:
        return "neutral"
    side = "for" if stance > 0 else "against"
    strength = abs(stance) / scale
    if strength >= 1:
        return f"strongly {side}"
    return f"{side}" if strength >= 0.5 else f"slightly {side}"


def seed_text(stance: int, scale: int, topic: str) -> str:
    """What a seed post (in the pool before round 1) says."""
    return f"I am {stance_label(stance, scale)}: {topic}"


def system_prompt(scale: int, post_chars: int) -> str:
    return ("You use a microblogging platform. Each round you read your feed, say where you stand on the "
            f"topic (a whole number from -{scale}, strongly against, to {scale}, strongly for), and may write "
            f"a post of at most {post_chars} characters, like a post, repost a post, follow the author of a post "
            "and stop following the author of a post. Answer with JSON only.")


def user_prompt(persona: str | None, topic: str, feed: Timeline, scale: int, post_chars: int) -> str:
    """The agent's prompt: its persona (the cacheable prefix), the topic, its last stance and its
    feed, each post numbered from 1."""
    lines = [persona] if persona else []
    lines.append(f'The topic: "{topic}"')
    lines.append(f"Your stance so far: {feed.stance:+d} ({stance_label(feed.stance, scale)}).")
    if len(feed):
        lines.append("Your feed:")
        for i in range(len(feed)):
            likes, reposts = feed.likes[i], feed.reposts[i]
            who = f"@{feed.authors[i]}" + (" (you follow them)" if feed.followed[i] else "")
            lines.append(f"[{i + 1}] {who}, stance {feed.stances[i]:+d}, {likes} like{'s' * (likes != 1)}, "
                         f"{reposts} repost{'s' * (reposts != 1)}: {json.dumps(feed.texts[i], ensure_ascii=False)}")
        pick = f"n is a post's number in your feed (1 to {len(feed)}), or 0 for none"
    else:
        lines.append("Your feed is empty.")
        pick = "n is 0 (your feed has no posts)"
    lines.append(f'Answer {{"stance": s, "post": "...", "like": n, "repost": n, "follow": n, "unfollow": n}}: '
                 f"s from -{scale} to {scale}; post is what you write (at most {post_chars} characters, "
                 f'"" for none); {pick}; follow and unfollow are about that post\'s author.')
    return "\n".join(lines)


@lru_cache(maxsize=256)
def _schema(scale: int, post_chars: int, posts: int) -> str:
    pick = {"type": "integer", "minimum": 0, "maximum": posts}
    return json.dumps({
        "type": "object",
        "properties": {"stance": {"type": "integer", "minimum": -scale, "maximum": scale},
                       "post": {"type": "string", "maxLength": post_chars},
                       "like": pick, "repost": pick, "follow": pick, "unfollow": pick},
        "required": ["stance", "post", "like", "repost", "follow", "unfollow"],
        "additionalProperties": False})


def answer_schema(scale: int, post_chars: int, posts: int) -> dict:
    """The answer's JSON schema for a feed of `posts` posts (a post's number is 1..posts, 0: none)."""
    return json.loads(_schema(scale, post_chars, posts))
