"""The message state machine: the only code that changes a message's state
or queue. Every transition is a guarded statement whose guard comes from one
table (``table.MACHINE``): a message that is no longer in a state the
transition starts from is left alone, so two processes racing for the same
message cannot both win, and a refused single-message action changes nothing
and raises ``IllegalTransition`` saying why.

    TBDL -> DLNG             claim                       in_flight.messages_claim
    DLNG -> DLVD or deleted  ack (delivered_retention)   in_flight.messages_ack
    DLNG -> TBDL             retry after a handler error in_flight.messages_retry
    DLNG -> TBDL on the DLQ  dead-letter                 in_flight.messages_dead_letter
    DLNG -> TBDL (suspect)   requeue an unanswered one   in_flight.messages_requeue_unanswered
    TBDL/DLNG -> NDLV        quarantine                  blacklist.messages_quarantine
    TBDL/DLNG -> deleted     purge as poison             blacklist.messages_purge_poison
    TBDL -> TBDL on the DLQ  expire                      expiry.messages_expire
    NDLV -> TBDL             release                     blacklist.messages_release
    NDLV -> FAIL             fail (terminal)             blacklist.messages_fail
    NDLV -> deleted          purge                       blacklist.messages_purge
    TBDL on a DLQ -> TBDL    forward                     dead_lettered.messages_forward
    TBDL on a DLQ -> TBDL    retry on the original queue dead_lettered.messages_retry_dead_lettered
    TBDL on a DLQ -> deleted discard                     dead_lettered.messages_discard
    TBDL -> deleted / DLQ    discard-old (full queue)    discards.messages_discard_old
    TBDL -> deleted          purge a queue's waiting     discards.messages_purge_waiting
    NDLV or on a DLQ         resubmit a corrected copy   resubmit.message_resubmit

Set-based forms take many ids and return the ids they moved; the operator's
single-message forms (``message_release``, ``message_forward``, …) sit beside
them and explain a refusal. Import them from their modules: ``resubmit``
publishes, and publishing discards through ``discards``.
"""
