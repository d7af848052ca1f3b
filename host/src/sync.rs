//! Locks taken whatever a panicking holder left. A `std::sync` lock is
//! poisoned when a thread panics while holding it. Every lock in the
//! operator guards data its holders change in one step (a map's insert, a
//! value's replacement), so what a panicking holder left is whole: the
//! lock is taken as it is, rather than panicking every later caller and
//! with them the process.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// [`Mutex::lock`], poisoned or not.
pub trait Locked<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`RwLock::read`] and [`RwLock::write`], poisoned or not.
pub trait ReadWrite<T: ?Sized> {
    fn reading(&self) -> RwLockReadGuard<'_, T>;
    fn writing(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> ReadWrite<T> for RwLock<T> {
    fn reading(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn writing(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`Mutex::into_inner`], poisoned or not.
pub fn into_value<T>(m: Mutex<T>) -> T {
    m.into_inner().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_whose_holder_panicked_is_taken_as_it_was_left() {
        let m = std::sync::Arc::new(Mutex::new(vec![1]));
        let held = m.clone();
        let _ = std::thread::spawn(move || {
            let mut guard = held.lock().unwrap();
            guard.push(2);
            panic!("the holder panics");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*m.locked(), vec![1, 2]);
        let rw = std::sync::Arc::new(RwLock::new(1));
        let held = rw.clone();
        let _ = std::thread::spawn(move || {
            let mut guard = held.write().unwrap();
            *guard = 2;
            panic!("the holder panics");
        })
        .join();
        assert!(rw.is_poisoned());
        *rw.writing() += 1;
        assert_eq!(*rw.reading(), 3);
        let m = std::sync::Arc::try_unwrap(m).unwrap();
        assert_eq!(into_value(m), vec![1, 2]);
    }
}
