"""A Flower app that does nothing but exchange messages: the reference pflower's rounds are measured against."""
