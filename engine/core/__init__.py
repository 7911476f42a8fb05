"""The engine's bookkeeping: sequences, the scheduler's step plan, the paged block manager,
and each request's stopping state. Nothing here touches a tensor."""
