"""Local fake servers speaking the real request/response shapes of the channel APIs."""
