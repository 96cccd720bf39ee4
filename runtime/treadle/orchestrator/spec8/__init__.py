"""The spec 8 run format (seed 000, seed 003 "Spec 8 and spec 9 side by side").

Several deliveries of one run may write at once; inline steps are protected by
message ownership (``ownership``) and in-process single-flight (``singleflight``).
"""
