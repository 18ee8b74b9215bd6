/** The namespace of the scheduler's job keys and leases. */
export const SCHEDULER_NAMESPACE = 'lockkit-scheduler';
