"""Small built-in name and trait lists for template personas (no LLM)."""

from __future__ import annotations

FEMALE_FIRST = (
    "Aisha", "Amelia", "Ana", "Chloe", "Elena", "Emma", "Fatima", "Grace", "Hana", "Ingrid",
    "Isabel", "Julia", "Leila", "Lucia", "Maria", "Maya", "Mei", "Nadia", "Olivia", "Priya",
    "Rosa", "Sara", "Sofia", "Yuki", "Zara",
)
MALE_FIRST = (
    "Adam", "Ahmed", "Andrei", "Carlos", "Daniel", "David", "Diego", "Ethan", "Hiro", "Ibrahim",
    "Ivan", "James", "Jonas", "Kenji", "Liam", "Lucas", "Marco", "Mateo", "Noah", "Omar",
    "Pavel", "Rahul", "Samuel", "Tomas", "Wei",
)
NEUTRAL_FIRST = (
    "Alex", "Ariel", "Avery", "Casey", "Charlie", "Jamie", "Jordan", "Kai", "Morgan", "Quinn",
    "Riley", "Robin", "Rowan", "Sam", "Taylor",
)
LAST = (
    "Ahmed", "Almeida", "Andersen", "Brown", "Chen", "Costa", "Dubois", "Fischer", "Garcia",
    "Hassan", "Ivanova", "Jensen", "Kim", "Kowalski", "Lopez", "Martin", "Meyer", "Moreau",
    "Nakamura", "Nguyen", "Novak", "Okafor", "Patel", "Rossi", "Santos", "Schmidt", "Silva",
    "Singh", "Smith", "Tanaka", "Wang", "Williams", "Yilmaz", "Zhang",
)
TRAITS = (
    "analytical", "cautious", "cheerful", "competitive", "curious", "decisive", "easygoing",
    "generous", "impulsive", "independent", "methodical", "optimistic", "patient", "pragmatic",
    "quiet", "sceptical", "sociable", "stubborn", "thoughtful", "witty",
)
