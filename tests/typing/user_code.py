import ratelimit
